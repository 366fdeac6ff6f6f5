"""pycaffe-compatible face: the Caffe-style Net over a compiled torch module."""

from torchcaffe.pycaffe.net import Net

__all__ = ["Net"]
