"""Fillers (filler.hpp): exact values where Caffe's are deterministic, and Caffe's refusals.

References are scalar ports of filler.hpp's loops, in the blob's Dtype.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import torchcaffe
from torchcaffe.errors import LayerParamError
from torchcaffe.ops.fillers import fill_
from torchcaffe.proto import caffe_pb2 as pb


def caffe_bilinear(k: int, dtype=np.float32) -> np.ndarray:
    """BilinearFiller::Fill for one (k, k) kernel: every step in Dtype (float blobs round
    c, x / f, each difference and the product to float)."""
    f = math.ceil(k / 2.0)
    c = dtype((k - 1) / (2.0 * f))
    out = np.empty(k * k, dtype)
    for i in range(k * k):
        x, y = dtype(i % k), dtype((i // k) % k)
        wx = dtype(dtype(1) - abs(dtype(x / dtype(f)) - c))
        wy = dtype(dtype(1) - abs(dtype(y / dtype(f)) - c))
        out[i] = dtype(wx * wy)
    return out.reshape(k, k)


# Caffe: BilinearFillerTest.TestFillOdd (7) / TestFillEven (6); 5 and 10 are kernels whose
# float arithmetic is not exact (c = 2/3, 9/10)
@pytest.mark.parametrize("k", [4, 5, 6, 7, 10, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bilinear_values_are_caffes_in_the_blob_dtype(k, dtype):
    blob = torch.empty(3, 2, k, k, dtype=dtype)
    fill_(blob, pb.FillerParameter(type="bilinear"))
    want = caffe_bilinear(k, np.float32 if dtype == torch.float32 else np.float64)
    for kernel in blob.reshape(-1, k, k):
        np.testing.assert_array_equal(kernel.numpy(), want)


# caffe_rng_gaussian: CHECK_GT(sigma, 0); caffe_rng_uniform: CHECK_LE(a, b). Caffe runs every
# filler at setup, before copying weights in, so a file with such a filler never loads.
@pytest.mark.parametrize(
    "filler,match",
    [
        ('type: "gaussian" std: 0', "positive std"),
        ('type: "gaussian" std: -1', "positive std"),
        ('type: "uniform" min: 2 max: 1', "min <= max"),
    ],
)
@pytest.mark.parametrize("with_weights", [False, True])
def test_fillers_caffe_refuses_name_the_layer(tmp_path, filler, match, with_weights):
    proto = tmp_path / "net.prototxt"
    proto.write_text(
        'input: "x" input_shape { dim: 2 dim: 3 }\n'
        'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"\n'
        f"  inner_product_param {{ num_output: 4 weight_filler {{ {filler} }} }} }}\n"
    )
    weights = None
    if with_weights:
        net = pb.NetParameter()
        layer = net.layer.add(name="ip", type="InnerProduct")
        for shape in ((4, 3), (4,)):
            blob = layer.blobs.add()
            blob.shape.dim.extend(shape)
            blob.data.extend([0.0] * math.prod(shape))
        weights = tmp_path / "w.caffemodel"
        weights.write_bytes(net.SerializeToString())
    with pytest.raises(LayerParamError, match=match) as err:
        torchcaffe.load(str(proto), None if weights is None else str(weights))
    assert "ip" in str(err.value)


def test_uniform_min_equal_max_fills_the_value():
    blob = torch.empty(3, 4)
    fill_(blob, pb.FillerParameter(type="uniform", min=1.5, max=1.5))
    assert (blob == 1.5).all()
