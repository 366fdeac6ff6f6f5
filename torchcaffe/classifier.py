"""pycaffe's ``caffe.Classifier``: a TEST-phase Net that classifies H x W x K images.

predict resizes the images to ``image_dims``, takes ten crops (``oversample``, predictions
averaged) or the center crop, preprocesses them with the Transformer and runs them through the
net in batches, returning the first output blob.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import io as caffe_io
from .proto import caffe_pb2
from .pycaffe.net import Net, forward_in_batches


def _configure_transformer(
    net: Net,
    mean: np.ndarray | None,
    input_scale: float | None,
    raw_scale: float | None,
    channel_swap: Sequence[int] | None,
) -> caffe_io.Transformer:
    in_ = net.inputs[0]
    transformer = caffe_io.Transformer({in_: net.blobs[in_].data.shape})
    transformer.set_transpose(in_, (2, 0, 1))
    if mean is not None:
        transformer.set_mean(in_, mean)
    if input_scale is not None:
        transformer.set_input_scale(in_, input_scale)
    if raw_scale is not None:
        transformer.set_raw_scale(in_, raw_scale)
    if channel_swap is not None:
        transformer.set_channel_swap(in_, channel_swap)
    return transformer


class Classifier(Net):
    """``Classifier(model_file, pretrained_file, image_dims=None, mean=None, input_scale=None,
    raw_scale=None, channel_swap=None)``, as pycaffe's."""

    def __init__(
        self,
        model_file: str | os.PathLike,
        pretrained_file: str | os.PathLike | None,
        image_dims: Sequence[int] | None = None,
        mean: np.ndarray | None = None,
        input_scale: float | None = None,
        raw_scale: float | None = None,
        channel_swap: Sequence[int] | None = None,
        **net_options: Any,
    ) -> None:
        super().__init__(model_file, weights=pretrained_file, phase=caffe_pb2.TEST, **net_options)
        self.transformer = _configure_transformer(self, mean, input_scale, raw_scale, channel_swap)
        self.crop_dims = np.array(self.blobs[self.inputs[0]].data.shape[2:])
        # pycaffe's ``if not image_dims``: None or an empty sequence means the input's size
        self.image_dims = (
            self.crop_dims if image_dims is None or not len(image_dims) else image_dims
        )

    def predict(self, inputs: Sequence[np.ndarray], oversample: bool = True) -> np.ndarray:
        """Class scores (N x classes) for H x W x K images."""
        input_ = np.zeros(
            (len(inputs), self.image_dims[0], self.image_dims[1], inputs[0].shape[2]),
            dtype=np.float32,
        )
        for ix, in_ in enumerate(inputs):
            input_[ix] = caffe_io.resize_image(in_, self.image_dims)
        if oversample:
            input_ = caffe_io.oversample(input_, self.crop_dims)
        else:
            center = np.array(self.image_dims) / 2.0
            crop = (
                np.tile(center, (1, 2))[0]
                + np.concatenate([-self.crop_dims / 2.0, self.crop_dims / 2.0])
            ).astype(int)
            input_ = input_[:, crop[0] : crop[2], crop[1] : crop[3], :]
        in_name = self.inputs[0]
        caffe_in = np.zeros(np.array(input_.shape)[[0, 3, 1, 2]], dtype=np.float32)
        for ix, in_ in enumerate(input_):
            caffe_in[ix] = self.transformer.preprocess(in_name, in_)
        out = forward_in_batches(self, None, {in_name: caffe_in})
        predictions = out[self.outputs[0]]
        if oversample:
            predictions = predictions.reshape((len(predictions) // 10, 10, -1)).mean(1)
        return predictions
