"""pycaffe's ``caffe.Detector``: a TEST-phase Net that scores windows of images (R-CNN style).

detect_windows crops each (ymin, xmin, ymax, xmax) window, optionally with ``context_pad``
pixels of context warped in around it (the rest filled with the mean), preprocesses the crops
with the Transformer and returns one ``{'window', 'prediction', 'filename'}`` per window.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import io as caffe_io
from .classifier import _configure_transformer
from .errors import MissingPackageError
from .proto import caffe_pb2
from .pycaffe.net import Net, forward_in_batches


class Detector(Net):
    """``Detector(model_file, pretrained_file, mean=None, input_scale=None, raw_scale=None,
    channel_swap=None, context_pad=None)``, as pycaffe's."""

    def __init__(
        self,
        model_file: str | os.PathLike,
        pretrained_file: str | os.PathLike | None,
        mean: np.ndarray | None = None,
        input_scale: float | None = None,
        raw_scale: float | None = None,
        channel_swap: Sequence[int] | None = None,
        context_pad: int | None = None,
        **net_options: Any,
    ) -> None:
        super().__init__(model_file, weights=pretrained_file, phase=caffe_pb2.TEST, **net_options)
        self.transformer = _configure_transformer(self, mean, input_scale, raw_scale, channel_swap)
        self.configure_crop(context_pad)

    def detect_windows(self, images_windows: Sequence[tuple[Any, Sequence[Any]]]) -> list[dict]:
        """Scores for each window of each image: ``[(filename or H x W x K array, windows)]``.

        Read once into lists: pycaffe walks the pairs twice (crops, then the results), so an
        iterator such as ``zip(files, windows)`` would give no results on Python 3.
        """
        images_windows = [(image, list(windows)) for image, windows in images_windows]
        window_inputs = []
        for image, windows in images_windows:
            im = image if isinstance(image, np.ndarray) else caffe_io.load_image(image)
            im = im.astype(np.float32)
            for window in windows:
                window_inputs.append(self.crop(im, np.asarray(window)))
        in_ = self.inputs[0]
        caffe_in = np.zeros(
            (len(window_inputs), window_inputs[0].shape[2]) + self.blobs[in_].data.shape[2:],
            dtype=np.float32,
        )
        for ix, window_in in enumerate(window_inputs):
            caffe_in[ix] = self.transformer.preprocess(in_, window_in)
        predictions = forward_in_batches(self, None, {in_: caffe_in})[self.outputs[0]]
        detections = []
        ix = 0
        for image, windows in images_windows:
            for window in windows:
                detections.append(
                    {"window": window, "prediction": predictions[ix], "filename": image}
                )
                ix += 1
        return detections

    def detect_selective_search(self, image_fnames: Sequence[str]) -> list[dict]:
        """Scores for the Selective Search windows of each image, as pycaffe's: windows from
        the selective_search_ijcv_with_python package (it runs MATLAB), then detect_windows.
        Without the package, a MissingPackageError, an ImportError as pycaffe's import gives."""
        try:
            import selective_search_ijcv_with_python as selective_search
        except ImportError as err:
            raise MissingPackageError(
                f"detect_selective_search needs the selective_search_ijcv_with_python "
                f"package ({err})",
                hint="install it from github.com/sergeyk/selective_search_ijcv_with_python, "
                "or compute windows yourself and call detect_windows",
            ) from err
        image_fnames = [os.path.abspath(f) for f in image_fnames]  # MATLAB's working dir differs
        windows_list = selective_search.get_windows(image_fnames, cmd="selective_search_rcnn")
        return self.detect_windows(list(zip(image_fnames, windows_list)))

    def crop(self, im: np.ndarray, window: np.ndarray) -> np.ndarray:
        """The window's pixels, or with context_pad the padded, warped context crop.

        Slicing truncates a fractional window (old numpy's float indices); the context box is
        computed from the window's own values, as pycaffe's arithmetic on ``window.copy()``.
        """
        w = np.asarray(window).astype(int)
        crop = im[w[0] : w[2], w[1] : w[3]]
        if not self.context_pad:
            return crop
        box = np.asarray(window, dtype=float)
        crop_size = int(self.blobs[self.inputs[0]].data.shape[3])  # assumes square input
        scale = crop_size / (1.0 * crop_size - self.context_pad * 2)
        half_h = (box[2] - box[0] + 1) / 2.0
        half_w = (box[3] - box[1] + 1) / 2.0
        center = (box[0] + half_h, box[1] + half_w)
        scaled = scale * np.array((-half_h, -half_w, half_h, half_w))
        box = np.round(np.tile(center, 2) + scaled)
        scale_h = crop_size / (box[2] - box[0] + 1)
        scale_w = crop_size / (box[3] - box[1] + 1)
        pad_y = int(round(max(0, -box[0]) * scale_h))
        pad_x = int(round(max(0, -box[1]) * scale_w))
        im_h, im_w = im.shape[:2]
        box = np.clip(box, 0.0, [im_h, im_w, im_h, im_w])
        crop_h = int(round((box[2] - box[0] + 1) * scale_h))
        crop_w = int(round((box[3] - box[1] + 1) * scale_w))
        crop_h = min(crop_h, crop_size - pad_y)
        crop_w = min(crop_w, crop_size - pad_x)
        b = box.astype(int)
        context = caffe_io.resize_image(im[b[0] : b[2], b[1] : b[3]], (crop_h, crop_w))
        out = np.ones(self.crop_dims, dtype=np.float32) * self.crop_mean
        out[pad_y : pad_y + crop_h, pad_x : pad_x + crop_w] = context
        return out

    def configure_crop(self, context_pad: int | None) -> None:
        """Crop size from the input blob; with context padding, the mean to fill with."""
        in_ = self.inputs[0]
        tpose = self.transformer.transpose[in_]
        inv_tpose = [tpose[t] for t in tpose]
        self.crop_dims = np.array(self.blobs[in_].data.shape[1:])[inv_tpose]
        self.context_pad = context_pad
        if not context_pad:
            return
        channel_order = self.transformer.channel_swap.get(in_)
        raw_scale = self.transformer.raw_scale.get(in_)
        mean = self.transformer.mean.get(in_)
        if mean is None:
            self.crop_mean = np.zeros(self.crop_dims, dtype=np.float32)
            return
        # In the mean's own dtype and shape ((1, 1, K) for a per-channel mean), as pycaffe's
        # in-place ``/=``: a float64 mean stays float64, so the padding is m / raw_scale exactly.
        mean = np.asarray(mean)
        if mean.ndim != 3:  # an H x W mean of a one-channel input
            mean = np.broadcast_to(mean, self.blobs[in_].data.shape[1:])
        crop_mean = mean.transpose(inv_tpose)
        if channel_order is not None:
            order = list(channel_order)
            crop_mean = crop_mean[:, :, [order.index(i) for i in range(crop_mean.shape[2])]]
        if raw_scale is not None:
            scaled = crop_mean / raw_scale
            kind = crop_mean.dtype if crop_mean.dtype.kind == "f" else scaled.dtype
            crop_mean = scaled.astype(kind)
        self.crop_mean = np.array(crop_mean)
