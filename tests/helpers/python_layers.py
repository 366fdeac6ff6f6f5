"""pycaffe-style Python layers used by tests/layers/test_python_layer.py (trusted test code)."""

from __future__ import annotations

import numpy as np

import torchcaffe as caffe


class EuclideanLossLayer(caffe.Layer):
    """pycaffe's classic example: 1/2N * sum((a - b)^2), caching the difference for backward."""

    def setup(self, bottom, top):
        if len(bottom) != 2:
            raise Exception("Need two inputs to compute distance.")

    def reshape(self, bottom, top):
        if bottom[0].count != bottom[1].count:
            raise Exception("Inputs must have the same dimension.")
        self.diff = np.zeros_like(bottom[0].data, dtype=np.float32)
        top[0].reshape(1)

    def forward(self, bottom, top):
        self.diff[...] = bottom[0].data - bottom[1].data
        top[0].data[...] = np.sum(self.diff**2) / bottom[0].num / 2.0

    def backward(self, top, propagate_down, bottom):
        for i in range(2):
            if not propagate_down[i]:
                continue
            sign = 1 if i == 0 else -1
            bottom[i].diff[...] = sign * top[0].diff[0] * self.diff / bottom[i].num


class AffineLayer(caffe.Layer):
    """y = w * x + b with per-channel w, b as learnable blobs; param_str sets the init of w."""

    def setup(self, bottom, top):
        init = float(eval(self.param_str)["w"]) if self.param_str else 1.0  # noqa: S307
        channels = bottom[0].data.shape[1]
        self.blobs.add_blob(channels)
        self.blobs.add_blob(channels)
        self.blobs[0].data[...] = init
        self.blobs[1].data[...] = np.arange(channels) * 0.1

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def _expand(self, v, ndim):
        return v.reshape((1, -1) + (1,) * (ndim - 2))

    def forward(self, bottom, top):
        x = bottom[0].data
        top[0].data[...] = self._expand(self.blobs[0].data, x.ndim) * x + self._expand(
            self.blobs[1].data, x.ndim
        )

    def backward(self, top, propagate_down, bottom):
        x, dy = bottom[0].data, top[0].diff
        axes = tuple(i for i in range(x.ndim) if i != 1)
        self.blobs[0].diff[...] += (dy * x).sum(axis=axes)
        self.blobs[1].diff[...] += dy.sum(axis=axes)
        if propagate_down[0]:
            bottom[0].diff[...] = dy * self._expand(self.blobs[0].data, x.ndim)


class NoBackwardLayer(caffe.Layer):
    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data * 2


class ForkParamStrLayer(caffe.Layer):
    """py-faster-rcnn style: setup reads ``self.param_str_`` (rbgirshick/caffe-fast-rcnn)."""

    def setup(self, bottom, top):
        self._scale = float(eval(self.param_str_)["scale"])  # noqa: S307

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data * self._scale


class PhaseKeyedLayer(caffe.Layer):
    """py-faster-rcnn style: ``cfg[str(self.phase)]`` picks per-phase settings."""

    CFG = {"TRAIN": 2.0, "TEST": 5.0}

    def setup(self, bottom, top):
        self._scale = self.CFG[str(self.phase)]

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data * self._scale


class DoubleTopInPlaceLayer(caffe.Layer):
    """Doubles its blob in place, through the top, relying on Caffe's in-place wiring: the
    top is the bottom's Blob, so ``reshape`` leaves it alone and the backward finds the top
    diff in the bottom's."""

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        top[0].data[...] *= 2

    def backward(self, top, propagate_down, bottom):
        bottom[0].diff[...] = top[0].diff * 2


class DoubleBottomInPlaceLayer(caffe.Layer):
    """``DoubleTopInPlaceLayer`` written through the bottom."""

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        bottom[0].data[...] *= 2

    def backward(self, top, propagate_down, bottom):
        bottom[0].diff[...] *= 2
