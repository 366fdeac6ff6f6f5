"""Bad arguments to the Python API raise TorchCaffeErrors that are also the exception type a
pycaffe script would catch (KeyError, OSError, DecodeError, Exception), never the bare error
of protobuf, numpy or scikit-image underneath."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError

import torchcaffe as caffe
from torchcaffe.errors import (
    ConfigError,
    DataError,
    FileReadError,
    ProtoDecodeError,
    TorchCaffeError,
    UnknownNameError,
    UsageError,
)

NET = 'layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 dim: 3 dim: 4 dim: 4 } } }\n'  # noqa: E501


@pytest.fixture
def proto(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    return str(path)


def test_level_and_stages_are_checked_before_the_proto_sees_them(proto):
    with pytest.raises(UsageError, match="level .* is an integer; got 'x'"):
        caffe.load(proto, level="x")
    with pytest.raises(ConfigError, match="a 32-bit integer, got 1099511627776"):
        caffe.load(proto, level=2**40)
    with pytest.raises(UsageError, match="stages are stage names"):
        caffe.load(proto, stages=[1, 2])
    with pytest.raises(UsageError, match=r"weights go in weights=\.\.\."):
        caffe.Net(proto, caffe.TEST, "w.caffemodel")  # pycaffe's third argument is level
    assert caffe.load(proto, level=np.int64(2)).state.level == 2


def test_forward_and_backward_name_an_unknown_blob_before_running(proto):
    net = caffe.Net(proto, caffe.TEST)
    for call in (lambda: net.forward(blobs=["nosuch"]), lambda: net.backward(diffs=["nosuch"])):
        with pytest.raises(UnknownNameError, match="names no blob of the net: 'nosuch'") as err:
            call()
        assert isinstance(err.value, KeyError)  # pycaffe's dict lookup raises one


def test_caffe_io_errors_are_torchcaffe_errors_of_pycaffes_types(tmp_path, proto):
    pytest.importorskip("skimage")
    with pytest.raises(FileReadError, match="nope.jpg: cannot read the file") as err:
        caffe.io.load_image(str(tmp_path / "nope.jpg"))
    assert isinstance(err.value, OSError) and err.value.filename.endswith("nope.jpg")
    with pytest.raises(ProtoDecodeError) as err:
        caffe.io.blobprotovector_str_to_arraylist(b"\xff\xff\xff garbage")
    assert isinstance(err.value, DecodeError)
    with pytest.raises(DataError, match=r"resize_image to \(100000, 100000\)"):
        caffe.io.resize_image(np.zeros((4, 4, 3), np.float32), (100000, 100000))
    transformer = caffe.io.Transformer({"data": (1, 3, 4, 4)})
    with pytest.raises(TorchCaffeError, match="nosuch is not one of the net inputs"):
        transformer.set_transpose("nosuch", (2, 0, 1))
