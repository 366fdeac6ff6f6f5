"""caffe.Classifier / caffe.Detector on a tiny random-weight net and a synthetic image."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import torchcaffe as caffe

pytest.importorskip("skimage")

NET = """
name: "tiny"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
"""


@pytest.fixture
def model(tmp_path):
    proto = tmp_path / "deploy.prototxt"
    proto.write_text(NET)
    net = caffe.Net(str(proto), caffe.TEST)
    weights = tmp_path / "w.caffemodel"
    net.save(str(weights))
    return str(proto), str(weights), net


def _reference(net, transformer, crops):
    batch = np.stack([transformer.preprocess("data", c) for c in crops])
    outs = []
    for i in range(0, len(batch), 2):
        chunk = batch[i : i + 2]
        net.blobs["data"].data[: len(chunk)] = chunk
        net.forward()
        outs.append(net.blobs["prob"].data[: len(chunk)].copy())
    return np.concatenate(outs)


def test_classifier_center_crop_and_oversample(model):
    proto, weights, net = model
    mean = np.array([0.1, 0.2, 0.3], np.float32)
    clf = caffe.Classifier(
        proto, weights, image_dims=(12, 12), mean=mean, raw_scale=2.0, channel_swap=(2, 1, 0)
    )
    rng = np.random.default_rng(0)
    images = [rng.random((20, 16, 3)).astype(np.float32) for _ in range(3)]
    resized = np.stack([caffe.io.resize_image(im, (12, 12)) for im in images])
    center = _reference(net, clf.transformer, resized[:, 2:10, 2:10, :])
    np.testing.assert_allclose(clf.predict(images, oversample=False), center, rtol=1e-4, atol=1e-6)
    ten = _reference(net, clf.transformer, caffe.io.oversample(resized, (8, 8)))
    want = ten.reshape(3, 10, -1).mean(1)
    got = clf.predict(images)
    assert got.shape == (3, 5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dims", [None, (), []])
def test_classifier_without_image_dims_resizes_to_the_crop(model, dims):
    """pycaffe's ``if not image_dims``: None or an empty sequence means the input's size."""
    proto, weights, _ = model
    clf = caffe.Classifier(proto, weights, image_dims=dims)
    assert list(clf.image_dims) == [8, 8]
    image = np.random.default_rng(1).random((11, 9, 3)).astype(np.float32)
    assert clf.predict([image], oversample=False).shape == (1, 5)


def test_detector_windows_and_context_pad(model):
    proto, weights, net = model
    rng = np.random.default_rng(1)
    image = rng.random((30, 40, 3)).astype(np.float32)
    windows = [np.array([0, 0, 8, 8]), np.array([5, 10, 25, 30])]
    det = caffe.Detector(proto, weights, mean=np.array([0.5, 0.5, 0.5]), raw_scale=1.0)
    out = det.detect_windows([(image, windows)])
    assert [d["window"] is w for d, w in zip(out, windows)] == [True, True]
    crops = [caffe.io.resize_image(image[0:8, 0:8], (8, 8)), image[5:25, 10:30]]
    want = _reference(net, det.transformer, crops)
    np.testing.assert_allclose(np.stack([d["prediction"] for d in out]), want, rtol=1e-4)
    padded = caffe.Detector(proto, weights, mean=np.array([0.5, 0.5, 0.5]), context_pad=2)
    crop = padded.crop(image, np.array([0, 0, 8, 8]))
    assert crop.shape == (8, 8, 3)
    assert np.all(crop[0, 0] == 0.5)  # the context outside the image is the mean
    assert len(padded.detect_windows([(image, windows)])) == 2


def test_detector_takes_an_iterator_of_pairs(model):
    """pycaffe's own detect_selective_search passes ``zip(...)``: each window still gets a
    detection (Python 2's list semantics), not an empty result."""
    proto, weights, _ = model
    image = np.random.default_rng(2).random((20, 20, 3)).astype(np.float32)
    windows = [np.array([0, 0, 8, 8]), np.array([2, 4, 18, 20])]
    det = caffe.Detector(proto, weights)
    want = det.detect_windows([(image, windows)])
    got = det.detect_windows(zip([image], iter([iter(windows)])))
    assert len(got) == 2
    for d, w in zip(got, want):
        assert d["window"] is w["window"]
        np.testing.assert_array_equal(d["prediction"], w["prediction"])


def test_detector_context_mean_keeps_the_mean_dtype_as_pycaffe(model):
    """configure_crop divides the mean by raw_scale in the mean's dtype (pycaffe's in-place
    ``/=``): a float64 mean pads with float64 m / 255, not a float32 rounding of it."""
    proto, weights, _ = model
    mean = np.array([104.3, 117.7, 123.1])
    det = caffe.Detector(
        proto, weights, mean=mean, raw_scale=255, channel_swap=[2, 0, 1], context_pad=2
    )
    want = mean[[1, 2, 0]].reshape(1, 1, 3) / 255
    assert det.crop_mean.dtype == np.float64
    np.testing.assert_array_equal(det.crop_mean, want)
    image = np.random.default_rng(3).random((30, 40, 3)).astype(np.float32)
    crop = det.crop(image, np.array([0, 0, 8, 8]))
    np.testing.assert_array_equal(crop[0, 0], want[0, 0])  # out-of-image context is the mean


def test_detect_selective_search_uses_the_package_or_raises_import_error(
    model, tmp_path, monkeypatch
):
    """pycaffe imports selective_search_ijcv_with_python inside the call: missing, scripts see
    an ImportError; present, its windows (for absolute paths) go to detect_windows."""
    import skimage.io

    proto, weights, _ = model
    det = caffe.Detector(proto, weights)
    monkeypatch.setitem(sys.modules, "selective_search_ijcv_with_python", None)
    with pytest.raises(ImportError, match="selective_search_ijcv_with_python"):
        det.detect_selective_search(["a.png"])

    monkeypatch.chdir(tmp_path)
    image = (np.random.default_rng(4).random((20, 24, 3)) * 255).astype(np.uint8)
    skimage.io.imsave("im.png", image, check_contrast=False)
    windows = [np.array([0, 0, 8, 8]), np.array([2, 4, 18, 20])]
    calls = []

    def get_windows(fnames, cmd):
        calls.append((fnames, cmd))
        return [windows]

    fake = types.SimpleNamespace(get_windows=get_windows)
    monkeypatch.setitem(sys.modules, "selective_search_ijcv_with_python", fake)
    got = det.detect_selective_search(["im.png"])
    full = str(tmp_path / "im.png")
    assert calls == [([full], "selective_search_rcnn")]
    want = det.detect_windows([(full, windows)])
    assert [d["filename"] for d in got] == [full, full]
    for d, w in zip(got, want):
        np.testing.assert_array_equal(d["prediction"], w["prediction"])


def _pycaffe_context_crop(im, window, crop_size, pad, crop_mean):
    """pycaffe Detector.crop's context arithmetic, float window as given (slices truncate)."""
    scale = crop_size / (1.0 * crop_size - pad * 2)
    half_h = (window[2] - window[0] + 1) / 2.0
    half_w = (window[3] - window[1] + 1) / 2.0
    center = (window[0] + half_h, window[1] + half_w)
    box = np.round(np.tile(center, 2) + scale * np.array((-half_h, -half_w, half_h, half_w)))
    scale_h = crop_size / (box[2] - box[0] + 1)
    scale_w = crop_size / (box[3] - box[1] + 1)
    pad_y = round(max(0, -box[0]) * scale_h)
    pad_x = round(max(0, -box[1]) * scale_w)
    box = np.clip(box, 0.0, [im.shape[0], im.shape[1]] * 2)
    crop_h = min(round((box[2] - box[0] + 1) * scale_h), crop_size - pad_y)
    crop_w = min(round((box[3] - box[1] + 1) * scale_w), crop_size - pad_x)
    b = box.astype(int)
    context = caffe.io.resize_image(im[b[0] : b[2], b[1] : b[3]], (crop_h, crop_w))
    out = np.ones((crop_size, crop_size, im.shape[2]), np.float32) * crop_mean
    out[pad_y : pad_y + crop_h, pad_x : pad_x + crop_w] = context
    return out


def test_detector_context_crop_of_a_fractional_window_as_pycaffe(model):
    """The context box comes from the window's float values, not from them truncated."""
    proto, weights, _ = model
    det = caffe.Detector(proto, weights, mean=np.array([0.5, 0.4, 0.3]), context_pad=2)
    image = np.random.default_rng(5).random((30, 40, 3)).astype(np.float32)
    for window in (np.array([10.7, 5.2, 20.9, 30.5]), np.array([0.5, 0.5, 6.5, 7.5])):
        want = _pycaffe_context_crop(image, window, 8, 2, det.crop_mean)
        np.testing.assert_array_equal(det.crop(image, window), want)
