"""caffe.coord_map as pycaffe's test_coord_map.py checks it (maps checked against shapes)."""

from __future__ import annotations

import numpy as np
import pytest

import torchcaffe as caffe
from torchcaffe import layers as L
from torchcaffe import params as P
from torchcaffe.coord_map import coord_map_from_to, crop


def coord_net_spec(ks=3, stride=1, pad=0, pool=2, dstride=2, dpad=0):
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 1, 100, 100]))
    n.aux = L.Input(shape=dict(dim=[2, 1, 20, 20]))
    n.conv = L.Convolution(n.data, num_output=10, kernel_size=ks, stride=stride, pad=pad)
    n.pool = L.Pooling(n.conv, pool=P.Pooling.MAX, kernel_size=pool, stride=pool, pad=0)
    deconv_ks = [s * 2 for s in dstride] if isinstance(dstride, list) else dstride * 2
    n.deconv = L.Deconvolution(  # Deconvolution's kwargs land in convolution_param
        n.pool, num_output=10, kernel_size=deconv_ks, stride=dstride, pad=dpad
    )
    return n


def test_conv_pool_deconv():
    n = coord_net_spec()
    assert coord_map_from_to(n.deconv, n.data) == (1, 1, 0)  # 2x pool then 2x deconv
    n = coord_net_spec(pool=4, dstride=4)
    assert coord_map_from_to(n.deconv, n.data) == (1, 1, -1)


def test_pass_through():
    n = coord_net_spec()
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    n.relu = L.ReLU(n.deconv)
    n.drop = L.Dropout(n.relu)
    ax_pass, a_pass, b_pass = coord_map_from_to(n.drop, n.data)
    assert (ax, a, b) == (ax_pass, a_pass, b_pass)


def test_padding():
    n = coord_net_spec()
    _, a, b = coord_map_from_to(n.deconv, n.data)
    pad = np.random.randint(10)
    n = coord_net_spec(pad=pad)
    _, a_pad, b_pad = coord_map_from_to(n.deconv, n.data)
    assert a == a_pad and b - pad == b_pad
    n = coord_net_spec(dpad=pad)
    _, a_dpad, b_dpad = coord_map_from_to(n.deconv, n.data)
    assert a == a_dpad and b + pad == b_dpad


def test_multi_conv():
    n = coord_net_spec()
    n.conv_data, n.conv_aux = L.Convolution(
        n.data, n.aux, ntop=2, num_output=10, kernel_size=5, stride=2, pad=0
    )
    assert coord_map_from_to(n.conv_data, n.data) == coord_map_from_to(n.conv_aux, n.aux)


def test_rect():
    n3 = coord_net_spec(ks=3, stride=1, pad=0)
    n5 = coord_net_spec(ks=5, stride=2, pad=10)
    n35 = coord_net_spec(ks=[3, 5], stride=[1, 2], pad=[0, 10])
    ax3, a3, b3 = coord_map_from_to(n3.deconv, n3.data)
    ax5, a5, b5 = coord_map_from_to(n5.deconv, n5.data)
    ax35, a35, b35 = coord_map_from_to(n35.deconv, n35.data)
    assert ax3 == ax5 == ax35
    assert (a3, b3, a5, b5) == (a35[0], b35[0], a35[1], b35[1])


def test_nd_conv():
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 3, 100, 100, 100]))
    n.conv = L.Convolution(
        n.data, num_output=10, kernel_size=[3, 3, 3], stride=[1, 1, 1], pad=[0, 1, 2]
    )
    n.pool = L.Pooling(n.conv, pool=P.Pooling.MAX, kernel_size=2, stride=2, pad=0)
    n.deconv = L.Deconvolution(n.pool, num_output=10, kernel_size=4, stride=2, pad=0)
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    assert ax == 1 and len(a) == len(b) and np.all(a == 1)
    assert b[0] - 1 == b[1] and b[1] - 1 == b[2]


def test_crop_helper_matches_loaded_shapes(tmp_path):
    n = coord_net_spec(dstride=2)
    n.crop = crop(n.deconv, n.data)
    layer = n.to_proto().layer[-1]
    assert layer.type == "Crop" and layer.crop_param.axis == 2
    path = tmp_path / "crop.prototxt"
    path.write_text(str(n.to_proto()))
    net = caffe.Net(str(path), caffe.TEST)
    assert net.blobs["crop"].data.shape[2:] == net.blobs["data"].data.shape[2:]
    _, a, b = coord_map_from_to(n.crop, n.data)
    assert a == 1 and b == 0  # after the crop, coordinates line up


def test_crop_of_crop():
    n = coord_net_spec()
    offset = np.random.randint(0, 10)
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    n.crop = L.Crop(n.deconv, n.data, axis=2, offset=offset)
    ax_crop, a_crop, b_crop = coord_map_from_to(n.crop, n.data)
    assert ax == ax_crop and a == a_crop and b + offset == b_crop


def test_catch_unconnected():
    n = coord_net_spec()
    n.ip = L.InnerProduct(n.deconv, num_output=10)
    with pytest.raises(RuntimeError, match="no chain of spatial layers"):
        coord_map_from_to(n.ip, n.data)


def test_scale_mismatch_refuses_to_crop():
    n = coord_net_spec(pool=3, dstride=2)
    with pytest.raises(AssertionError, match="scale mismatch"):
        crop(n.deconv, n.data)


def test_negative_crop_refused():
    n = coord_net_spec(dpad=10)
    with pytest.raises(AssertionError, match="negative"):
        crop(n.deconv, n.data)


def test_legacy_h_w_keyword_beside_convolution_param_is_refused():
    """pycaffe refuses a pad_h/kernel_h/stride_h keyword on the layer even when the geometry
    comes from convolution_param (the keyword lands in the same message at to_proto, so the
    map would ignore a pad the net applies)."""
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 20, 20]))
    n.conv = L.Convolution(n.data, convolution_param=dict(num_output=1, kernel_size=3), pad_h=2)
    with pytest.raises(AssertionError, match="legacy"):
        coord_map_from_to(n.conv, n.data)


def test_concat_maps_only_along_channels():
    """A channel Concat keeps coordinates (U-Nets crop through it); a spatial one shifts
    them per bottom, so it has no map, as pycaffe has none for any Concat."""
    n = coord_net_spec()
    n.cat = L.Concat(n.data, n.data)
    n.c = L.Convolution(n.cat, kernel_size=3, num_output=1)
    assert coord_map_from_to(n.c, n.data) == (1, 1, 1)
    n.wide = L.Concat(n.data, n.data, axis=2)
    n.c2 = L.Convolution(n.wide, kernel_size=3, num_output=1)
    with pytest.raises(RuntimeError):
        coord_map_from_to(n.c2, n.data)
