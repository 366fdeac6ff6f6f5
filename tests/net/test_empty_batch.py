"""A batch of 0 runs as Caffe runs it: every layer loops over no item, so each top has the
shape Caffe's Reshape gives it (``infer_shapes``) and no values, forward and backward. Where
Caffe itself cannot take it (a Reshape that infers a dim from a count of 0 divides by zero,
a recurrent net's timesteps are fixed at set-up), a TorchCaffeError names the layer: never a
bare torch error from a ``reshape(n, -1)``, which cannot infer a size from no elements."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from google.protobuf import text_format

import torchcaffe
from torchcaffe.errors import ExportError, TorchCaffeError
from torchcaffe.net.export import batch_groups
from torchcaffe.proto import caffe_pb2
from torchcaffe.pycaffe.lazy_forward import data_shaped_blobs

from ..helpers.golden import InFolder, case_inputs, case_net, input_fed_cases
from ..helpers.programs import off_cpu_programs

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
CASES = [pytest.param(c, id=c.id) for c in input_fed_cases(GOLDEN)]

# cases a batch of 0 ran through before the fix, each through a reshape(n, -1)
ONCE_BARE = {
    "layers/ip_axis2",
    "layers/reduction_asum_axis1_coeff",
    "layers/reduction_mean_neg_axis",
    "layers/reduction_sumsq_axis2",
    "layers/slice_axis0_equal",
    "forks/maxunpool_after_pool",
}


def _empty_batch(net: torchcaffe.TorchNet, inputs: dict[str, torch.Tensor]) -> dict:
    """``inputs`` with axis 0 emptied where it is the batch (``batch_groups``: the blobs whose
    axis 0 goes with the data's; a prior-box blob or a sequence marker keeps its own)."""
    try:
        symbolic = batch_groups(net, {k: tuple(v.shape) for k, v in inputs.items()})
    except ExportError:  # no axis 0 is free to change (recurrent timesteps, a Slice's parts)
        symbolic = set(inputs)
    return {k: v[:0] if k in symbolic and v.dim() else v for k, v in inputs.items()}


def _run(net: torchcaffe.TorchNet, inputs: dict[str, torch.Tensor], record: bool) -> dict:
    if not record:
        with torch.inference_mode():
            return net(**inputs)
    fed = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in inputs.items()}
    outputs = net(**fed)
    recorded = [o.sum() for o in outputs.values() if o.requires_grad]
    if recorded:
        torch.stack(recorded).sum().backward()
    return outputs


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("program", ["CPU", "GPU"], ids=["cpu-program", "gpu-program"])
@pytest.mark.parametrize("record", [False, True], ids=["inference", "fwd+bwd"])
def test_a_batch_of_zero_gives_empty_tops_or_a_located_error(case, program, record, monkeypatch):
    """Also through the passes' forms for a GPU (``off_cpu_programs``)."""
    with InFolder(case.path):
        net = case_net(case)
        if program == "GPU":
            off_cpu_programs(monkeypatch, net)
        inputs = _empty_batch(net, case_inputs(case))
        assert any(v.shape[0] == 0 for v in inputs.values() if v.dim())
        try:
            shapes = net.infer_shapes({k: tuple(v.shape) for k, v in inputs.items()})
            outputs = _run(net, inputs, record)
        except TorchCaffeError as err:
            assert case.id not in ONCE_BARE, err
            return
    told_by_values = data_shaped_blobs(net)  # a detection's count: Caffe's guess differs
    for name, top in outputs.items():
        if name not in told_by_values:
            assert tuple(top.shape) == tuple(shapes[name]), name


# a MobileNet tail: a 1x1 convolution over pooled 1x1 features (a GEMM on the CPU), and
# 1x1 convolutions over a channels_last region (pixel rows)
TAIL = """
input: "data" input_shape { dim: 1 dim: 8 dim: 6 dim: 6 }
layer { name: "c1" type: "Convolution" bottom: "data" top: "a"
  convolution_param { num_output: 8 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "c2" type: "Convolution" bottom: "a" top: "b"
  convolution_param { num_output: 8 kernel_size: 1 weight_filler { type: "xavier" } } }
layer { name: "pool" type: "Pooling" bottom: "b" top: "p"
  pooling_param { pool: AVE global_pooling: true } }
layer { name: "fc" type: "Convolution" bottom: "p" top: "f"
  convolution_param { num_output: 5 kernel_size: 1 weight_filler { type: "xavier" } } }
"""


@pytest.mark.parametrize("record", [False, True], ids=["inference", "fwd+bwd"])
def test_a_pointwise_convolution_takes_a_batch_of_zero(record):
    net = torchcaffe.load(text_format.Parse(TAIL, caffe_pb2.NetParameter()), phase="test")
    x = torch.rand(0, 8, 6, 6)
    assert _run(net, {"data": x}, record)["f"].shape == (0, 5, 1, 1)
    channels_last = x.to(memory_format=torch.channels_last)
    assert _run(net, {"data": channels_last}, record)["f"].shape == (0, 5, 1, 1)


# layers that flatten per item, which no golden case reaches with a batch of 0
PER_ITEM = """
input: "data" input_shape { dim: 1 dim: 4 dim: 6 dim: 6 }
input: "a" input_shape { dim: 1 dim: 4 dim: 1 dim: 1 }
input: "b" input_shape { dim: 1 dim: 4 dim: 1 dim: 1 }
input: "same" input_shape { dim: 1 dim: 1 dim: 1 dim: 1 }
layer { name: "spp" type: "SPP" bottom: "data" top: "spp" spp_param { pyramid_height: 2 } }
layer { name: "argmax" type: "ArgMax" bottom: "data" top: "argmax" argmax_param { top_k: 2 } }
layer { name: "contrastive" type: "ContrastiveLoss" bottom: "a" bottom: "b" bottom: "same"
  top: "loss" }
"""


@pytest.mark.parametrize("record", [False, True], ids=["inference", "fwd+bwd"])
def test_per_item_layers_take_a_batch_of_zero(record):
    net = torchcaffe.load(text_format.Parse(PER_ITEM, caffe_pb2.NetParameter()), phase="test")
    inputs = {"data": torch.rand(0, 4, 6, 6), "a": torch.rand(0, 4, 1, 1)}
    inputs.update(b=torch.rand(0, 4, 1, 1), same=torch.zeros(0, 1, 1, 1))
    shapes = net.infer_shapes({k: tuple(v.shape) for k, v in inputs.items()})
    outputs = _run(net, inputs, record)
    for name in ("spp", "argmax", "loss"):
        assert tuple(outputs[name].shape) == tuple(shapes[name]), name
    assert shapes["spp"][0] == shapes["argmax"][0] == 0


def test_a_detection_output_over_no_image_is_the_forks_placeholder():
    """The fork's DetectionOutput finds no detection in a batch of 0: its top is 1x1x0x7
    (``num_kept`` 0: one placeholder row per image, of which there is none)."""
    case = next(c for c in input_fed_cases(GOLDEN) if c.id == "forks/detection_output_ssd")
    with InFolder(case.path):
        net = case_net(case)
        inputs = case_inputs(case)
    empty = {k: v if k == "prior" else v[:0] for k, v in inputs.items()}
    with torch.inference_mode():
        (top,) = net(**empty).values()
    assert top.shape == (1, 1, 0, 7)


@pytest.mark.parametrize(
    "kind, param, top",
    [
        ("ROIPooling", "roi_pooling_param { pooled_h: 3 pooled_w: 3 spatial_scale: 0.5 }", 8),
        (
            "PSROIPooling",
            "psroi_pooling_param { spatial_scale: 0.5 output_dim: 2 group_size: 2 }",
            2,
        ),
    ],
)
def test_a_roi_pooling_over_no_roi_backpropagates_zeros(kind, param, top):
    """A detector's batch can keep no proposal: the top is empty, and a loss over it still
    reaches the features (Caffe's Backward over no ROI leaves their diff zero)."""
    text = f"""
    input: "data" input_shape {{ dim: 1 dim: 8 dim: 10 dim: 10 }}
    input: "rois" input_shape {{ dim: 3 dim: 5 }}
    layer {{ name: "p" type: "{kind}" bottom: "data" bottom: "rois" top: "out" {param} }}
    """
    net = torchcaffe.load(text_format.Parse(text, caffe_pb2.NetParameter()), phase="test")
    x = torch.rand(1, 8, 10, 10, requires_grad=True)
    out = net(data=x, rois=torch.zeros(0, 5))["out"]
    assert out.shape[0] == 0 and out.shape[1] == top
    out.sum().backward()
    assert x.grad is not None and not x.grad.any()
