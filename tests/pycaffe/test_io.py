"""caffe.io in the manner of pycaffe's test_io.py, through ``import torchcaffe as caffe``."""

from __future__ import annotations

import numpy as np
import pytest

import torchcaffe as caffe
from torchcaffe.errors import ArrayShapeError, TorchCaffeError, UsageError
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


def test_blobproto_to_array_is_float64_as_pycaffe():
    # BVLC pycaffe (built from source, protobuf 3.21 python) returns float64 here; upb's
    # repeated-float container would otherwise give numpy a float32 buffer
    arr = np.array([[0.1, 1e-8], [3.0, -2.5]], np.float32)
    blob = caffe.io.array_to_blobproto(arr, diff=2 * arr)
    for back in (caffe.io.blobproto_to_array(blob), caffe.io.blobproto_to_array(blob, True)):
        assert back.dtype == np.float64
    (vec,) = caffe.io.blobprotovector_str_to_arraylist(
        caffe.io.arraylist_to_blobprotovector_str([arr])
    )
    assert vec.dtype == np.float64
    np.testing.assert_array_equal(vec, arr)


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


def test_datum_to_array_uint8_is_writable():
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    back = caffe.io.datum_to_array(caffe.io.array_to_datum(arr))
    assert back.flags.writeable  # pycaffe's np.fromstring copies
    back[0, 0, 0] = 200
    assert back[0, 0, 0] == 200


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
        t.set_mean("data", np.zeros((2, 4, 6)))
    with pytest.raises(ValueError, match="invalid"):
        t.set_mean("data", np.zeros((1, 3, 4, 5)))
    t.set_mean("data", np.zeros((3, 4, 5)))  # elementwise mean is fine


# -- set_mean with a mean of another size, and pycaffe's dtypes (python/caffe/io.py at HEAD) --


def _pycaffe_resized_mean(mean, dims):
    """pycaffe's set_mean resize, with skimage as pycaffe's resize_image calls it."""
    skt = pytest.importorskip("skimage.transform")
    lo, hi = mean.min(), mean.max()
    normal = ((mean - lo) / (hi - lo)).transpose(1, 2, 0)
    # resize_image scales to [0, 1] by min/max again: a no-op on the already normal mean
    resized = skt.resize(normal, dims, order=1, mode="constant").astype(np.float32)
    return resized.transpose(2, 0, 1) * (hi - lo) + lo


def test_set_mean_resizes_a_mean_of_another_size_like_pycaffe():
    pytest.importorskip("skimage")
    rng = np.random.default_rng(3)
    mean = rng.random((3, 16, 20)) * 60 + 90  # ilsvrc_2012_mean.npy-like: larger than the input
    t = caffe.io.Transformer({"data": (2, 3, 8, 10)})
    t.set_mean("data", mean)
    want = _pycaffe_resized_mean(mean, (8, 10))
    assert t.mean["data"].shape == (3, 8, 10)
    np.testing.assert_allclose(t.mean["data"], want, rtol=1e-6)
    t.set_transpose("data", (2, 0, 1))
    img = rng.random((8, 10, 3)).astype(np.float32)
    got = t.preprocess("data", img)
    expected = img.transpose(2, 0, 1).copy()
    expected -= want
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_classifier_takes_a_mean_larger_than_its_input(tmp_path):
    pytest.importorskip("skimage")
    proto = tmp_path / "deploy.prototxt"
    proto.write_text(
        'layer { name: "data" type: "Input" top: "data"'
        "        input_param { shape { dim: 1 dim: 3 dim: 6 dim: 6 } } }"
        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"'
        '        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }'
        'layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }'
    )
    weights = str(tmp_path / "w.caffemodel")
    caffe.Net(str(proto), caffe.TEST).save(weights)
    mean = np.random.default_rng(4).random((3, 8, 8)) * 100  # 256 vs 227 in miniature
    clf = caffe.Classifier(str(proto), weights, image_dims=(8, 8), mean=mean, raw_scale=255)
    np.testing.assert_allclose(clf.transformer.mean["data"], _pycaffe_resized_mean(mean, (6, 6)))
    probs = clf.predict([np.random.default_rng(5).random((9, 9, 3)).astype(np.float32)])
    assert probs.shape == (1, 3) and np.allclose(probs.sum(), 1, rtol=1e-5)


def test_set_mean_one_channel_mean_broadcasts_over_channels():
    pytest.importorskip("skimage")
    mean = np.arange(20, dtype=np.float64).reshape(1, 4, 5)
    t = caffe.io.Transformer({"data": (1, 3, 4, 5)})
    t.set_transpose("data", (2, 0, 1))
    t.set_mean("data", mean)  # pycaffe: the resize path at the same size, then broadcasting
    np.testing.assert_allclose(t.mean["data"], mean, atol=1e-5)
    out = t.preprocess("data", np.full((4, 5, 3), 100.0, np.float32))
    assert out.shape == (3, 4, 5)
    np.testing.assert_allclose(out, np.broadcast_to(100.0 - mean, (3, 4, 5)), atol=1e-4)


def test_set_mean_of_another_size_still_refuses_other_channel_counts():
    t = caffe.io.Transformer({"data": (1, 3, 8, 10)})
    for bad in (np.zeros((2, 16, 20)), np.zeros((4, 8, 10)), np.zeros(2)):
        with pytest.raises(ArrayShapeError) as err:
            t.set_mean("data", bad)
        assert isinstance(err.value, ValueError) and isinstance(err.value, TorchCaffeError)
    assert "data" not in t.mean


def test_set_mean_constant_mean_of_another_size_stays_constant():
    pytest.importorskip("skimage")
    t = caffe.io.Transformer({"data": (1, 3, 4, 5)})
    t.set_mean("data", np.full((3, 8, 10), 7.5))
    assert t.mean["data"].shape == (3, 4, 5) and np.all(t.mean["data"] == 7.5)


def test_set_mean_two_d_mean_of_another_size_for_one_channel():
    pytest.importorskip("skimage")
    mean = np.random.default_rng(6).random((8, 10))
    t = caffe.io.Transformer({"data": (1, 1, 4, 5)})
    t.set_mean("data", mean)
    np.testing.assert_allclose(t.mean["data"], _pycaffe_resized_mean(mean[None], (4, 5)))


def _pycaffe_preprocess(img, mean):
    """pycaffe's preprocess steps, in place on a float32 copy (transpose, swap, scales, mean)."""
    x = img.astype(np.float32).transpose(2, 0, 1)[[2, 1, 0], :, :]
    x *= 255.0
    x -= mean
    x *= 0.017
    return x


def test_preprocess_is_float32_as_pycaffe_with_a_float64_mean():
    rng = np.random.default_rng(7)
    mean = rng.random((3, 4, 5)) * 100  # float64, as np.load('...mean.npy') gives
    t = caffe.io.Transformer({"data": (1, 3, 4, 5)})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255.0)
    t.set_mean("data", mean)
    t.set_input_scale("data", 0.017)
    img = rng.random((4, 5, 3))  # float64 image
    kept = img.copy()
    out = t.preprocess("data", img)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, _pycaffe_preprocess(img, mean))
    np.testing.assert_array_equal(img, kept)
    img32 = img.astype(np.float32)
    kept32 = img32.copy()
    t.preprocess("data", img32)
    np.testing.assert_array_equal(img32, kept32)  # pycaffe's in-place steps would write it


def test_deprocess_keeps_the_data_dtype_as_pycaffe():
    rng = np.random.default_rng(8)
    mean = rng.random(3) * 100
    t = caffe.io.Transformer({"data": (1, 3, 4, 5)})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255.0)
    t.set_mean("data", mean)
    t.set_input_scale("data", 0.017)
    blob = rng.random((1, 3, 4, 5)).astype(np.float32)
    want = blob.copy().squeeze()  # pycaffe's deprocess, in place
    want /= 0.017
    want += mean[:, None, None]
    want /= 255.0
    want = want[np.argsort((2, 1, 0)), :, :].transpose(np.argsort((2, 0, 1)))
    got = t.deprocess("data", blob)
    assert got.dtype == np.float32 and got.shape == (4, 5, 3)
    np.testing.assert_array_equal(got, want)
    assert t.deprocess("data", blob.astype(np.float64)).dtype == np.float64
    with pytest.raises(UsageError, match="dtype"):  # pycaffe: numpy's casting TypeError
        t.deprocess("data", np.ones((1, 3, 4, 5), np.int64))


def test_preprocess_mean_that_does_not_broadcast_is_a_value_error():
    t = caffe.io.Transformer({"data": (1, 3, 4, 5)})
    t.set_mean("data", np.zeros((3, 4, 5)))
    with pytest.raises(ArrayShapeError, match="transpose"):  # no transpose: H x W x K data
        t.preprocess("data", np.zeros((4, 5, 3), np.float32))


def test_image_functions_without_scikit_image_raise_import_error(monkeypatch):
    """pycaffe's caffe.io imports scikit-image, so scripts guard it with ``except ImportError``."""
    import sys

    monkeypatch.setitem(sys.modules, "skimage", None)
    with pytest.raises(ImportError, match="scikit-image"):
        caffe.io.load_image("missing.png")
    with pytest.raises(ImportError, match="scikit-image"):
        caffe.io.resize_image(np.zeros((4, 5, 3), np.float32) + np.arange(5)[:, None], (2, 2))


def test_module_names_pycaffe_imported_into_caffe_io():
    """Scripts call caffe.io.resize (skimage's) and caffe.io.skimage.img_as_float."""
    import scipy.ndimage
    import skimage.transform

    assert caffe.io.resize is skimage.transform.resize
    assert caffe.io.zoom is scipy.ndimage.zoom
    assert caffe.io.skimage.io.imread is not None
    img = caffe.io.skimage.img_as_float(np.full((4, 6, 3), 255, np.uint8))
    assert caffe.io.resize(img, (2, 3, 3)).shape == (2, 3, 3)
    with pytest.raises(AttributeError):
        caffe.io.not_a_name  # noqa: B018
