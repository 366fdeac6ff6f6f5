"""pycaffe's ``caffe.io``: image loading/resizing, BlobProto/Datum <-> numpy, ``Transformer``.

Names, argument orders, exception types and numerics follow pycaffe so old scripts run
unchanged. Image functions use scikit-image (and SciPy), as pycaffe does; they live in the
``pycaffe`` extra (``pip install torchcaffe[pycaffe]``). ``resize_image`` is scikit-image's
``resize(order=1, mode='constant')``, which low-pass filters before downsampling (0.19+).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from . import limits
from .errors import (
    ArrayShapeError,
    DataError,
    FileReadError,
    MissingPackageError,
    ProtoDecodeError,
    UsageError,
)
from .proto import caffe_pb2

_EXTRA_HINT = "pip install torchcaffe[pycaffe]"


def _skimage() -> Any:
    try:
        import skimage
        import skimage.io
        import skimage.transform
    except ImportError as err:  # also an ImportError, as pycaffe's ``import caffe.io`` raises
        raise MissingPackageError(
            f"caffe.io image functions need scikit-image ({err}); install it with {_EXTRA_HINT}"
        ) from err
    return skimage


def __getattr__(name: str) -> Any:
    """``skimage``, ``resize`` and ``zoom``: names pycaffe's caffe.io imported into itself,
    which scripts use (``caffe.io.resize(im, (h, w, 3))``, ``caffe.io.skimage.img_as_float``).
    Imported on first use, so that scikit-image stays optional."""
    if name == "skimage":
        return _skimage()
    if name == "resize":
        return _skimage().transform.resize
    if name == "zoom":
        _skimage()  # scipy comes with scikit-image: one extra for both
        from scipy.ndimage import zoom

        return zoom
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- images -----------------------------------------------------------------------------------


def load_image(filename: str, color: bool = True) -> np.ndarray:
    """An image as float32 H x W x K in [0, 1] (K = 3 color RGB, 1 gray), as pycaffe reads it."""
    skimage = _skimage()
    try:
        raw = skimage.io.imread(filename, as_gray=not color)
    except OSError as err:  # a missing or unreadable file; an undecodable one is skimage's
        raise FileReadError.of(err, str(filename)) from None
    img = skimage.img_as_float(raw).astype(np.float32)
    if img.ndim == 2:
        img = img[:, :, np.newaxis]
        if color:
            img = np.tile(img, (1, 1, 3))
    elif img.shape[2] == 4:
        img = img[:, :, :3]
    return img


def resize_image(
    im: np.ndarray, new_dims: Sequence[int] | np.ndarray, interp_order: int = 1
) -> np.ndarray:
    """``im`` (H x W x K) resized to ``new_dims`` (height, width), float32.

    1- or 3-channel images are scaled to [0, 1], resized with scikit-image (anti-aliased when
    downsampling) and scaled back; a constant image stays constant. Other channel counts are
    zoomed with ``scipy.ndimage.zoom``, as pycaffe does.
    """
    problem = limits.shape_problem((int(new_dims[0]), int(new_dims[1]), int(im.shape[-1])))
    if problem:  # numpy would try to allocate it
        raise DataError(f"resize_image to {tuple(new_dims)}: {problem}")
    if im.shape[-1] == 1 or im.shape[-1] == 3:
        skimage = _skimage()
        im_min, im_max = im.min(), im.max()
        if im_max > im_min:
            im_std = (im - im_min) / (im_max - im_min)
            resized_std = skimage.transform.resize(
                im_std, tuple(new_dims), order=interp_order, mode="constant"
            )
            resized_im = resized_std * (im_max - im_min) + im_min
        else:
            ret = np.empty((new_dims[0], new_dims[1], im.shape[-1]), dtype=np.float32)
            ret.fill(im_min)
            return ret
    else:
        _skimage()  # scipy comes with scikit-image: one extra for both
        from scipy.ndimage import zoom

        scale = tuple(np.array(new_dims, dtype=float) / np.array(im.shape[:2]))
        resized_im = zoom(im, scale + (1,), order=interp_order)
    return np.asarray(resized_im).astype(np.float32)


def oversample(
    images: Sequence[np.ndarray] | np.ndarray, crop_dims: Sequence[int] | np.ndarray
) -> np.ndarray:
    """Ten crops per image: four corners and the center, then their mirrors (N*10 x h x w x K)."""
    im_shape = np.array(images[0].shape)
    crop = np.array(crop_dims)
    im_center = im_shape[:2] / 2.0
    corners = [
        (i, j, i + crop[0], j + crop[1])
        for i in (0, im_shape[0] - crop[0])
        for j in (0, im_shape[1] - crop[1])
    ]
    center = np.tile(im_center, (1, 2))[0] + np.concatenate([-crop / 2.0, crop / 2.0])
    crops_ix = np.tile(np.array(corners + [tuple(center)], dtype=int), (2, 1))
    crops = np.empty((10 * len(images), crop[0], crop[1], im_shape[-1]), dtype=np.float32)
    ix = 0
    for im in images:
        for y0, x0, y1, x1 in crops_ix:
            crops[ix] = im[y0:y1, x0:x1, :]
            ix += 1
        crops[ix - 5 : ix] = crops[ix - 5 : ix, :, ::-1, :]  # the second five are mirrored
    return crops


# -- BlobProto / Datum --------------------------------------------------------------------------


def blobproto_to_array(blob: caffe_pb2.BlobProto, return_diff: bool = False) -> np.ndarray:
    """The blob's data (or diff) as float64, shaped by the legacy 4-D fields when any is set,
    else by ``shape.dim`` (no dims: a 0-d scalar). A count/shape mismatch raises
    ArrayShapeError (a ValueError, as numpy's reshape in pycaffe raises).
    """
    # dtype named: protobuf's upb containers hand numpy a float32 buffer, the protobuf of
    # Caffe's era a list of Python floats (float64), which a mean computed from it keeps
    data = np.array(blob.diff if return_diff else blob.data, dtype=np.float64)
    if any(blob.HasField(f) for f in ("num", "channels", "height", "width")):
        return _reshaped(data, (blob.num, blob.channels, blob.height, blob.width), "BlobProto")
    return _reshaped(data, tuple(blob.shape.dim), "BlobProto")


def _reshaped(data: np.ndarray, shape: tuple[int, ...], what: str) -> np.ndarray:
    """``data.reshape(shape)``; a count that does not fit says both (numpy's message names
    neither the proto nor the count the shape asks for)."""
    try:
        return data.reshape(shape)
    except ValueError:
        raise ArrayShapeError(
            f"{what} data does not fit its shape {shape}",
            expected=f"{math.prod(shape)} values" if min(shape, default=0) >= 0 else "dims >= 0",
            got=f"{data.size} values",
        ) from None


def array_to_blobproto(arr: np.ndarray, diff: np.ndarray | None = None) -> caffe_pb2.BlobProto:
    """A BlobProto with ``shape`` and float ``data`` (and ``diff``) from N-d arrays."""
    arr = np.asarray(arr)
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend(int(d) for d in arr.shape)
    blob.data.extend(arr.astype(np.float32).ravel().tolist())
    if diff is not None:
        blob.diff.extend(np.asarray(diff).astype(np.float32).ravel().tolist())
    return blob


def arraylist_to_blobprotovector_str(arraylist: Iterable[np.ndarray]) -> bytes:
    """A serialized BlobProtoVector of the arrays."""
    vec = caffe_pb2.BlobProtoVector()
    vec.blobs.extend(array_to_blobproto(arr) for arr in arraylist)
    return vec.SerializeToString()


def blobprotovector_str_to_arraylist(s: bytes) -> list[np.ndarray]:
    """The arrays of a serialized BlobProtoVector."""
    vec = caffe_pb2.BlobProtoVector()
    try:
        vec.ParseFromString(s)
    except DecodeError as err:
        raise ProtoDecodeError(f"not a serialized BlobProtoVector ({err})") from None
    return [blobproto_to_array(blob) for blob in vec.blobs]


def array_to_datum(arr: np.ndarray, label: int | None = None) -> caffe_pb2.Datum:
    """A Datum from a C x H x W array: uint8 goes to ``data`` bytes, anything else to
    ``float_data``. Not 3-D raises ArrayShapeError (a ValueError, as pycaffe's)."""
    if arr.ndim != 3:
        raise ArrayShapeError("Incorrect array shape.")
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = (int(d) for d in arr.shape)
    if arr.dtype == np.uint8:
        datum.data = arr.tobytes()
    else:
        datum.float_data.extend(arr.astype(float).ravel().tolist())
    if label is not None:
        datum.label = label
    return datum


def datum_to_array(datum: caffe_pb2.Datum) -> np.ndarray:
    """A Datum's C x H x W array: uint8 from ``data`` bytes, else float64 from ``float_data``.
    The label is not part of it. A writable copy, as pycaffe's ``np.fromstring`` gives."""
    shape = (datum.channels, datum.height, datum.width)
    if len(datum.data):
        return _reshaped(np.frombuffer(datum.data, dtype=np.uint8), shape, "Datum").copy()
    return _reshaped(np.array(datum.float_data).astype(float), shape, "Datum")


# -- Transformer ------------------------------------------------------------------------------


def _keep_dtype(op: np.ufunc, arr: np.ndarray, operand: Any, where: str, name: str) -> np.ndarray:
    """``op(arr, operand)`` in ``arr``'s dtype: the values pycaffe's in-place ``arr op= x``
    gives (numpy computes in the wider type and casts back), without writing ``arr``."""
    try:
        out = op(arr, operand)
    except ValueError:
        raise ArrayShapeError(
            f"Transformer.{where}: the {name} does not broadcast onto the data (is the "
            "transpose set to give K x H x W?)",
            expected=f"a {name} broadcastable to {arr.shape}",
            got=np.shape(operand),
        ) from None
    try:
        return out.astype(arr.dtype, casting="same_kind", copy=False)
    except TypeError:
        raise UsageError(
            f"Transformer.{where} computes in the data's dtype, as pycaffe's in-place "
            f"arithmetic does, and {out.dtype} results do not fit it",
            expected="float data",
            got=str(arr.dtype),
        ) from None


def _resize_mean(mean: np.ndarray, dims: Sequence[int]) -> np.ndarray:
    """pycaffe's set_mean resize of a C x H x W mean to ``dims``: scaled to [0, 1] by its
    min/max, ``resize_image``, scaled back. A constant mean stays constant (pycaffe: NaN)."""
    m_min, m_max = mean.min(), mean.max()
    if m_max == m_min:
        return np.full((mean.shape[0], dims[0], dims[1]), m_min)
    normal_mean = (mean - m_min) / (m_max - m_min)
    resized = resize_image(normal_mean.transpose((1, 2, 0)), dims).transpose((2, 0, 1))
    return resized * (m_max - m_min) + m_min


class Transformer:
    """Turns H x W x K images into a net input (K x H x W, scaled, mean-subtracted) and back.

    ``inputs`` maps input blob names to their shapes (N, K, H, W). preprocess applies, in
    order: resize to the input's H x W, transpose, channel swap, raw scale, mean subtraction,
    input scale; deprocess undoes them (without resizing). A name that is not an input raises
    ``Exception``, as pycaffe; bad transpose/channel-swap lengths raise ``Exception`` and bad
    mean shapes ``ValueError``. Arithmetic keeps pycaffe's dtypes: preprocess gives float32,
    deprocess the dtype of its data.
    """

    def __init__(self, inputs: Mapping[str, Sequence[int]]) -> None:
        self.inputs = inputs
        self.transpose: dict[str, Sequence[int]] = {}
        self.channel_swap: dict[str, Sequence[int]] = {}
        self.raw_scale: dict[str, float] = {}
        self.mean: dict[str, np.ndarray] = {}
        self.input_scale: dict[str, float] = {}

    def __check_input(self, in_: str) -> None:
        if in_ not in self.inputs:
            raise UsageError(f"{in_} is not one of the net inputs: {self.inputs}")

    def preprocess(self, in_: str, data: np.ndarray) -> np.ndarray:
        """``data`` (H' x W' x K image) as input ``in_`` of the net, float32 (``data`` is not
        written, unlike pycaffe's in-place steps on a float32 image)."""
        self.__check_input(in_)
        caffe_in = np.asarray(data).astype(np.float32, copy=False)
        in_dims = tuple(self.inputs[in_][2:])
        if caffe_in.shape[:2] != in_dims:
            caffe_in = resize_image(caffe_in, in_dims)
        transpose = self.transpose.get(in_)
        if transpose is not None:
            caffe_in = caffe_in.transpose(transpose)
        channel_swap = self.channel_swap.get(in_)
        if channel_swap is not None:
            caffe_in = caffe_in[list(channel_swap), :, :]
        raw_scale = self.raw_scale.get(in_)
        if raw_scale is not None:
            caffe_in = _keep_dtype(np.multiply, caffe_in, raw_scale, "preprocess", "raw scale")
        mean = self.mean.get(in_)
        if mean is not None:
            caffe_in = _keep_dtype(np.subtract, caffe_in, mean, "preprocess", "mean")
        input_scale = self.input_scale.get(in_)
        if input_scale is not None:
            caffe_in = _keep_dtype(np.multiply, caffe_in, input_scale, "preprocess", "input scale")
        return caffe_in

    def deprocess(self, in_: str, data: np.ndarray) -> np.ndarray:
        """Undo preprocess (except resizing) on a net input: back to H x W x K, in ``data``'s
        dtype as pycaffe's in-place steps keep it."""
        self.__check_input(in_)
        decaf_in = np.array(data, copy=True).squeeze()
        input_scale = self.input_scale.get(in_)
        if input_scale is not None:
            decaf_in = _keep_dtype(
                np.true_divide, decaf_in, input_scale, "deprocess", "input scale"
            )
        mean = self.mean.get(in_)
        if mean is not None:
            decaf_in = _keep_dtype(np.add, decaf_in, mean, "deprocess", "mean")
        raw_scale = self.raw_scale.get(in_)
        if raw_scale is not None:
            decaf_in = _keep_dtype(np.true_divide, decaf_in, raw_scale, "deprocess", "raw scale")
        channel_swap = self.channel_swap.get(in_)
        if channel_swap is not None:
            decaf_in = decaf_in[np.argsort(channel_swap), :, :]
        transpose = self.transpose.get(in_)
        if transpose is not None:
            decaf_in = decaf_in.transpose(np.argsort(transpose))
        return decaf_in

    def set_transpose(self, in_: str, order: Sequence[int]) -> None:
        """Axis order to apply, e.g. (2, 0, 1) for H x W x K -> K x H x W."""
        self.__check_input(in_)
        if len(order) != len(self.inputs[in_]) - 1:
            raise UsageError(
                "Transpose order needs to have the same number of dimensions as the input."
            )
        self.transpose[in_] = order

    def set_channel_swap(self, in_: str, order: Sequence[int]) -> None:
        """Channel order to take, e.g. (2, 1, 0) for RGB -> BGR (after transpose)."""
        self.__check_input(in_)
        if len(order) != self.inputs[in_][1]:
            raise UsageError(
                "Channel swap needs to have the same number of dimensions as the input channels."
            )
        self.channel_swap[in_] = order

    def set_raw_scale(self, in_: str, scale: float) -> None:
        """Multiply the raw input by ``scale`` (e.g. 255 for [0, 1] images), before the mean."""
        self.__check_input(in_)
        self.raw_scale[in_] = scale

    def set_mean(self, in_: str, mean: np.ndarray) -> None:
        """Subtract ``mean``: per channel (K,) or elementwise (K x H x W, or H x W for K = 1).

        An elementwise mean of another H x W (ilsvrc_2012_mean.npy's 256 x 256 for a 227
        input) is resized to the input's, as pycaffe does (see ``_resize_mean``). Its channels
        must be the input's K, or 1 (broadcast over the channels, as pycaffe's arithmetic does).
        """
        self.__check_input(in_)
        mean = np.asarray(mean)
        ms = mean.shape
        in_shape = tuple(self.inputs[in_][1:])
        if mean.ndim == 1:
            if ms[0] != in_shape[0]:
                raise ArrayShapeError(
                    "Mean channels incompatible with input", expected=in_shape[0], got=ms[0]
                )
            mean = mean[:, np.newaxis, np.newaxis]
        else:
            if len(ms) == 2:
                ms = (1,) + ms
            if len(ms) != 3:
                raise ArrayShapeError(
                    "Mean shape invalid", expected="(K,), (K, H, W) or (H, W)", got=mean.shape
                )
            if ms != in_shape:
                if len(in_shape) != 3 or ms[0] not in (1, in_shape[0]):
                    raise ArrayShapeError(
                        "Mean shape incompatible with input shape (a mean is resized to the "
                        "input's height and width, but needs its channels or 1)",
                        expected=in_shape,
                        got=mean.shape,
                    )
                mean = _resize_mean(mean.reshape(ms), in_shape[1:])
        self.mean[in_] = mean

    def set_input_scale(self, in_: str, scale: float) -> None:
        """Multiply the mean-subtracted input by ``scale`` (after raw scale and mean)."""
        self.__check_input(in_)
        self.input_scale[in_] = scale
