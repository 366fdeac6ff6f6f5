"""caffe.io in the manner of pycaffe's test_io.py, through ``import torchcaffe as caffe``."""

from __future__ import annotations

import numpy as np
import pytest

import torchcaffe as caffe
from torchcaffe.proto import caffe_pb2


def test_blobproto_old_4d_format():
    blob = caffe_pb2.BlobProto()
    blob.num, blob.channels, blob.height, blob.width = 2, 3, 4, 5
    blob.data.extend(range(120))
    arr = caffe.io.blobproto_to_array(blob)
    assert arr.shape == (2, 3, 4, 5)
    assert arr[1, 2, 3, 4] == 119


def test_blobproto_new_nd_format():
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend([6, 7])
    blob.data.extend(range(42))
    assert caffe.io.blobproto_to_array(blob).shape == (6, 7)


def test_blobproto_no_shape_is_value_error():
    blob = caffe_pb2.BlobProto()
    blob.data.extend([1, 2, 3])
    with pytest.raises(ValueError):
        caffe.io.blobproto_to_array(blob)


def test_blobproto_scalar():
    blob = caffe_pb2.BlobProto()
    blob.data.append(1.5)
    arr = caffe.io.blobproto_to_array(blob)
    assert arr.shape == () and float(arr) == 1.5


def test_array_blobproto_round_trip_with_diff():
    arr = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    blob = caffe.io.array_to_blobproto(arr, diff=-arr)
    assert list(blob.shape.dim) == [2, 3, 4]
    np.testing.assert_array_equal(caffe.io.blobproto_to_array(blob), arr)
    np.testing.assert_array_equal(caffe.io.blobproto_to_array(blob, return_diff=True), -arr)


def test_blobprotovector_str_round_trip():
    arrays = [np.random.rand(2, 3).astype(np.float32), np.random.rand(4).astype(np.float32)]
    s = caffe.io.arraylist_to_blobprotovector_str(arrays)
    back = caffe.io.blobprotovector_str_to_arraylist(s)
    assert len(back) == 2
    for a, b in zip(arrays, back):
        np.testing.assert_array_equal(a, b)


def test_array_to_datum_uint8_and_float():
    arr = np.random.randint(0, 255, (3, 4, 5)).astype(np.uint8)
    datum = caffe.io.array_to_datum(arr, label=7)
    assert datum.label == 7 and len(datum.data) == 60 and not datum.float_data
    back = caffe.io.datum_to_array(datum)
    assert back.dtype == np.uint8
    np.testing.assert_array_equal(back, arr)
    farr = np.random.rand(1, 2, 3)
    fdatum = caffe.io.array_to_datum(farr)
    assert fdatum.label == 0 and not fdatum.data
    np.testing.assert_allclose(caffe.io.datum_to_array(fdatum), farr, rtol=1e-6)


def test_array_to_datum_wrong_rank():
    with pytest.raises(ValueError):
        caffe.io.array_to_datum(np.zeros((2, 3)))


def test_resize_image_antialiases_like_skimage():
    skt = pytest.importorskip("skimage.transform")
    rng = np.random.default_rng(0)
    im = rng.random((40, 50, 3)).astype(np.float32) * 3 + 1
    out = caffe.io.resize_image(im, (10, 12))
    assert out.shape == (10, 12, 3) and out.dtype == np.float32
    lo, hi = im.min(), im.max()
    want = skt.resize((im - lo) / (hi - lo), (10, 12), order=1, mode="constant") * (hi - lo) + lo
    np.testing.assert_allclose(out, want, rtol=1e-6)
    # anti-aliasing: a downsampled random image is much smoother than plain bilinear sampling
    plain = skt.resize(im, (10, 12), order=1, mode="constant", anti_aliasing=False)
    assert out.std() < 0.8 * plain.std()


def test_resize_image_constant_and_many_channels():
    pytest.importorskip("skimage")
    const = np.full((5, 6, 3), 2.5, np.float32)
    out = caffe.io.resize_image(const, (3, 4))
    assert out.shape == (3, 4, 3) and np.all(out == 2.5)
    many = np.random.rand(4, 4, 5).astype(np.float32)
    assert caffe.io.resize_image(many, (8, 8)).shape == (8, 8, 5)


def test_load_image_color_and_gray(tmp_path):
    skio = pytest.importorskip("skimage.io")
    img = (np.random.rand(7, 9, 3) * 255).astype(np.uint8)
    path = str(tmp_path / "x.png")
    skio.imsave(path, img, check_contrast=False)
    color = caffe.io.load_image(path)
    assert color.shape == (7, 9, 3) and color.dtype == np.float32
    np.testing.assert_allclose(color, img / 255.0, atol=1e-6)
    gray = caffe.io.load_image(path, color=False)
    assert gray.shape == (7, 9, 1)


def test_oversample_ten_crops():
    im = np.arange(6 * 8 * 2, dtype=np.float32).reshape(6, 8, 2)
    crops = caffe.io.oversample([im, im + 1], (4, 4))
    assert crops.shape == (20, 4, 4, 2)
    np.testing.assert_array_equal(crops[0], im[:4, :4])
    np.testing.assert_array_equal(crops[3], im[2:, 4:])
    np.testing.assert_array_equal(crops[4], im[1:5, 2:6])  # center
    np.testing.assert_array_equal(crops[5], im[:4, :4][:, ::-1])  # mirrored
    np.testing.assert_array_equal(crops[10], im[:4, :4] + 1)


def _transformer():
    t = caffe.io.Transformer({"data": (1, 3, 4, 5)})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255.0)
    t.set_mean("data", np.array([10.0, 20.0, 30.0]))
    t.set_input_scale("data", 0.5)
    return t


def test_transformer_preprocess_matches_formula_and_deprocess_inverts():
    t = _transformer()
    img = np.random.rand(4, 5, 3).astype(np.float32)
    out = t.preprocess("data", img)
    want = (img.transpose(2, 0, 1)[[2, 1, 0]] * 255.0 - np.array([10, 20, 30])[:, None, None]) * 0.5
    assert out.shape == (3, 4, 5)
    np.testing.assert_allclose(out, want, rtol=1e-5)
    np.testing.assert_allclose(t.deprocess("data", out[None]), img, rtol=1e-5, atol=1e-5)


def test_transformer_resizes_to_input_dims():
    pytest.importorskip("skimage")
    t = _transformer()
    assert t.preprocess("data", np.random.rand(8, 10, 3)).shape == (3, 4, 5)


def test_transformer_checks():
    t = caffe.io.Transformer({"data": (1, 3, 4, 5)})
    with pytest.raises(Exception, match="not one of the net inputs"):
        t.set_raw_scale("nope", 1.0)
    with pytest.raises(Exception, match="Transpose order"):
        t.set_transpose("data", (1, 0))
    with pytest.raises(Exception, match="Channel swap"):
        t.set_channel_swap("data", (1, 0))
    with pytest.raises(ValueError, match="Mean channels"):
        t.set_mean("data", np.zeros(2))
    with pytest.raises(ValueError, match="incompatible"):
        t.set_mean("data", np.zeros((3, 4, 6)))
    with pytest.raises(ValueError, match="invalid"):
        t.set_mean("data", np.zeros((1, 3, 4, 5)))
    t.set_mean("data", np.zeros((3, 4, 5)))  # elementwise mean is fine
