"""MemoryData: rows of the arrays given by reset / net.set_input_arrays, batch by batch."""

from __future__ import annotations

import numpy as np
import pytest

import torchcaffe
from tests.helpers.cases import LayerCase
from tests.helpers.harness import make_layer
from torchcaffe.errors import DataError, LayerParamError

SNIPPET = (
    'top: "data" top: "label" memory_data_param { batch_size: 2 channels: 1 height: 2 width: 3 }'
)

CASES = [
    # Forward needs arrays first (reset); the generic checks build, repr and round-trip it.
    LayerCase("MemoryData", SNIPPET, bottom_shapes=(), n_tops=2, deterministic=False),
]


def layer():
    return make_layer(SNIPPET, (), type="MemoryData", n_tops=2)[0]


def test_serves_rows_and_wraps():
    m = layer()
    data = np.arange(4 * 6, dtype=np.float32).reshape(4, 1, 2, 3)
    m.reset(data, np.arange(4))
    assert m.output_shapes([]) == [(2, 1, 2, 3), (2,)]  # setup; each forward gives 4-D
    for rows in ([0, 1], [2, 3], [0, 1]):
        d, y = m()
        np.testing.assert_array_equal(d.numpy(), data[rows])
        np.testing.assert_array_equal(y.numpy().ravel(), rows)
        assert y.shape == (2, 1, 1, 1)


def test_forward_before_reset_says_what_to_do():
    with pytest.raises(DataError, match="set_input_arrays"):
        layer()()


@pytest.mark.parametrize(
    "data,labels,match",
    [
        (np.zeros((4, 1, 2, 2)), np.zeros(4), "wrong shape"),
        (np.zeros((4, 1, 2, 3)), np.zeros(3), "same first dimension"),
        (np.zeros((3, 1, 2, 3)), np.zeros(3), "multiple of batch_size"),
    ],
)
def test_bad_arrays(data, labels, match):
    with pytest.raises(DataError, match=match):
        layer().reset(data, labels)


def test_dims_must_be_positive():
    with pytest.raises(LayerParamError, match="positive"):
        make_layer(
            'top: "a" top: "b" memory_data_param { batch_size: 2 }', (), type="MemoryData", n_tops=2
        )


def test_net_set_input_arrays(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(f'layer {{ name: "m" type: "MemoryData" {SNIPPET} }}')
    net = torchcaffe.Net(str(path), torchcaffe.TEST)
    data = np.random.default_rng(0).standard_normal((4, 1, 2, 3)).astype(np.float32)
    net.set_input_arrays(data, np.arange(4, dtype=np.float32))
    net.forward()
    np.testing.assert_array_equal(net.blobs["data"].data, data[:2])
    labels = np.arange(4, dtype=np.float32).reshape(4, 1, 1, 1)
    net._set_input_arrays(data[::-1].copy(), labels)  # pycaffe's binding, 4-D labels
    net.forward()
    np.testing.assert_array_equal(net.blobs["data"].data, data[3:1:-1])
    np.testing.assert_array_equal(net.blobs["label"].data.ravel(), [0, 1])
    other = tmp_path / "other.prototxt"
    other.write_text('input: "x" input_shape { dim: 1 }')
    with pytest.raises(RuntimeError, match="MemoryData"):
        torchcaffe.Net(str(other), torchcaffe.TEST).set_input_arrays(data, np.arange(4))


@pytest.mark.parametrize(
    "data,labels,match",
    [
        (np.zeros((4, 1, 2, 3)), np.zeros(4, np.float32), "data array must be float32"),
        (np.zeros((4, 1, 2, 3), np.float32), np.arange(4), "labels array must be float32"),
        (
            np.zeros((4, 1, 3, 2), np.float32).transpose(0, 1, 3, 2),
            np.zeros(4, np.float32),
            "data array must be C contiguous",
        ),
        (np.zeros((4, 6), np.float32), np.zeros(4, np.float32), "data array must be 4-d"),
        (
            np.zeros((4, 1, 2, 3), np.float32),
            np.zeros((4, 1), np.float32),
            "labels array must be 4-d",
        ),
        (
            np.zeros((4, 2, 2, 3), np.float32),
            np.zeros(4, np.float32),
            "data array has the wrong shape",
        ),
        (np.zeros((4, 1, 2, 3), np.float32), np.zeros(3, np.float32), "same first dimension"),
        (np.zeros((3, 1, 2, 3), np.float32), np.zeros(3, np.float32), "multiple of batch_size"),
    ],
)
def test_set_input_arrays_checks_as_pycaffe(tmp_path, data, labels, match):
    """pycaffe's binding refuses what MemoryData cannot serve in place, with a RuntimeError."""
    path = tmp_path / "net.prototxt"
    path.write_text(f'layer {{ name: "m" type: "MemoryData" {SNIPPET} }}')
    net = torchcaffe.Net(str(path), torchcaffe.TEST)
    with pytest.raises(RuntimeError, match=match):
        net.set_input_arrays(data, labels)


def test_set_input_arrays_serves_the_callers_memory(tmp_path):
    """Reset keeps the caller's pointer: rows written after the call are what a forward reads."""
    path = tmp_path / "net.prototxt"
    path.write_text(f'layer {{ name: "m" type: "MemoryData" {SNIPPET} }}')
    net = torchcaffe.Net(str(path), torchcaffe.TEST)
    data = np.zeros((2, 1, 2, 3), np.float32)
    net.set_input_arrays(data, np.zeros(2, np.float32))
    data[...] = 7
    net.forward()
    np.testing.assert_array_equal(net.blobs["data"].data, data)


def test_label_is_1d_until_the_first_forward(tmp_path):
    """Caffe's DataLayerSetUp shapes the label (batch_size,); Forward_cpu reshapes it to
    (batch_size, 1, 1, 1). Scripts print the blob shapes right after building the net."""
    path = tmp_path / "net.prototxt"
    path.write_text(f'layer {{ name: "m" type: "MemoryData" {SNIPPET} }}')
    net = torchcaffe.Net(str(path), torchcaffe.TEST)
    assert net.blobs["label"].data.shape == (2,)
    net.set_input_arrays(np.zeros((2, 1, 2, 3), np.float32), np.zeros(2, np.float32))
    net.forward()
    assert net.blobs["label"].data.shape == (2, 1, 1, 1)
