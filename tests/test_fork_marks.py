"""Fork layer types are marked in the registry (``fork``), BVLC Caffe's types are not."""

from __future__ import annotations

from torchcaffe.cli.__main__ import main
from torchcaffe.registry import registered_layers

# Every layer type BVLC Caffe's own registry knows (caffe/src/caffe/layers), by its type string.
BVLC_TYPES = set(
    "AbsVal Accuracy ArgMax BNLL BatchNorm BatchReindex Bias Clip Concat ContrastiveLoss "
    "Convolution Crop Data Deconvolution Dropout DummyData ELU Eltwise Embed EuclideanLoss Exp "
    "Filter Flatten HDF5Data HDF5Output HingeLoss Im2col ImageData InfogainLoss InnerProduct "
    "Input LRN LSTM LSTMUnit Log MVN MemoryData MultinomialLogisticLoss PReLU Parameter "
    "Pooling Power Python RNN Reduction ReLU Reshape SPP Scale Sigmoid SigmoidCrossEntropyLoss "
    "Silence Slice Softmax SoftmaxWithLoss Split Swish TanH Threshold Tile WindowData".split()
)


def test_fork_is_set_exactly_on_non_bvlc_types():
    for name, cls in registered_layers().items():
        if name in BVLC_TYPES:
            assert cls.fork is None, name
        else:
            assert cls.fork, f"{name} is not a BVLC type but names no fork"


def test_known_forks():
    layers = registered_layers()
    assert layers["PriorBox"].fork == "SSD"
    assert layers["PSROIPooling"].fork == "R-FCN"
    assert layers["ShuffleChannel"].fork == "ShuffleNet"
    assert layers["BatchNormKyle"].fork == "brocolli"  # subclass of BVLC BatchNorm
    assert layers["BatchNorm"].fork is None


def test_layers_table_shows_the_fork_column(capsys):
    assert main(["layers"]) == 0
    text = capsys.readouterr().out
    assert "| Type | Fork |" in text
    assert "| PriorBox | SSD |" in text
    assert "| Convolution | - |" in text
