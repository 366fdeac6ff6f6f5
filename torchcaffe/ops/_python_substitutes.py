"""Native equivalents of well-known ``type: "Python"`` layers, so their models run unchanged.

A model naming ``python_param { module layer }`` asks Caffe to import that module. For the
modules listed in ``NATIVE_SUBSTITUTES`` torchcaffe can instead run a native layer that
computes the same thing, without importing anything (``param_str`` is read as a literal by
``ast.literal_eval``, never ``eval``). ``PythonLayer.from_param`` decides which runs and warns
with ``NativeSubstituteWarning`` when it is the substitute.

Served today: rbgirshick/py-faster-rcnn lib/rpn/proposal_layer.py (``rpn.proposal_layer``
``ProposalLayer``), with generate_anchors.py, fast_rcnn/bbox_transform.py and the default
GPU NMS (nms/gpu_nms.pyx, nms_kernel.cu).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from google.protobuf import text_format

from ..errors import LayerParamError, TorchCaffeError
from ..proto import caffe_pb2
from ..trust import ENV_VAR
from .base import CaffeLayer, Shape
from .proposal import ProposalLayer

RUN_MODULE_HINT = (
    "to run the model's own module instead, put it on sys.path and opt in "
    f"(allow_python_layers=True or {ENV_VAR}=1)"
)


class NativeSubstituteWarning(UserWarning):
    """A Python layer runs as torchcaffe's native equivalent, not as the model's module."""


def parse_param_str(lp: caffe_pb2.LayerParameter) -> dict[str, Any]:
    """``param_str`` as ``yaml.load`` reads a flat mapping, by ``ast.literal_eval``.

    Accepts ``'feat_stride': 16``, ``{'feat_stride': 16, 'scales': [8, 16]}``, bare keys
    (``feat_stride: 16``), one entry per line, and ``!!python/tuple [...]`` values.
    """
    text = re.sub(r"!!python/tuple\s*", "", lp.python_param.param_str.strip())
    if not text.startswith("{"):
        text = "{" + ", ".join(line.strip() for line in text.splitlines() if line.strip()) + "}"
    text = re.sub(r"([{,]\s*)([A-Za-z_]\w*)\s*:", r"\1'\2':", text)  # quote bare keys
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise LayerParamError(
            "python_param.param_str is not a literal mapping",
            expected="e.g. param_str: \"'feat_stride': 16\"",
            got=repr(lp.python_param.param_str),
        )
    return value


def _numbers(value: Any, key: str) -> list[float]:
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values
    ):
        raise LayerParamError(f"param_str '{key}' must be positive numbers", got=repr(value))
    return [float(v) for v in values]


def py_faster_rcnn_anchors(
    scales: Sequence[float], ratios: Sequence[float], base_size: int = 16
) -> np.ndarray:
    """generate_anchors() in float64: ratio widths np.round(sqrt(b^2 / r)) (halves to even),
    heights np.round(w * r), then each scaled by s about the base box's centre."""
    ctr = 0.5 * (base_size - 1)
    ratios_ = np.asarray(ratios, dtype=np.float64)
    ws = np.round(np.sqrt(base_size * base_size / ratios_))
    hs = np.round(ws * ratios_)
    out = []
    for w, h in zip(ws, hs):
        for s in scales:
            half_w, half_h = 0.5 * (w * s - 1), 0.5 * (h * s - 1)
            out.append([ctr - half_w, ctr - half_h, ctr + half_w, ctr + half_h])
    return np.array(out, dtype=np.float64).reshape(-1, 4)


class PyFasterRCNNProposalLayer(ProposalLayer):
    """py-faster-rcnn's ``rpn.proposal_layer.ProposalLayer``, computed natively.

    Built by ``rpn_proposal`` for a ``type: "Python"`` layer (layer_param kept as read), with a
    ProposalParameter holding its param_str and cfg values. Differs from the fork's Proposal:
    generate_anchors() anchors (scale multiplies base_size), min_size scaled by im_info[2],
    boxes under it removed (not zero-scored), NMS suppressing at IoU > thresh with no
    disjoint early exit (the GPU kernel), a single image only, scores top K x 1. Ties in score
    follow a stable ``argsort()[::-1]``: the pre-NMS cut keeps the later anchors, and NMS
    (which sorts again) visits the kept ones in anchor order.
    """

    caffe_type = "Python"
    param_field = "python_param"
    min_im_info = 3
    nms_disjoint_zero = False
    restrictions = (
        "cfg values are py-faster-rcnn's defaults (a script's cfg changes do not "
        "reach it); numpy's default argsort orders ties among more than 16 scores "
        "its own way (here: as a stable sort); cpu_nms (USE_GPU_NMS False) "
        "suppresses at IoU >= thresh"
    )

    def __init__(
        self,
        layer_param,
        bottom_shapes,
        proposal_param: caffe_pb2.ProposalParameter,
        scales: Sequence[float],
        ratios: Sequence[float],
    ):
        CaffeLayer.__init__(self, layer_param, bottom_shapes)
        self.native_param = proposal_param
        self.anchor_scales, self.anchor_ratios = list(scales), list(ratios)
        if self.bottom_shapes[0] and self.bottom_shapes[0][0] != 1:
            raise self.error(
                "Only single item batches are supported",
                expected="N = 1",
                got=self.bottom_shapes[0][0],
            )
        self._setup(proposal_param)

    @property
    def param(self) -> caffe_pb2.ProposalParameter:
        return self.native_param

    def make_anchors(self) -> np.ndarray:
        return py_faster_rcnn_anchors(
            self.anchor_scales, self.anchor_ratios, int(self.param.base_size)
        )

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        self.check_bottoms(bottom_shapes)
        return [(1, 5), (1, 1, 1, 1)][: self.num_tops]  # what the Python layer's setup sets

    def select(self, boxes, fg, im_info):
        min_size = float(self.param.min_size) * im_info[2]
        big = (boxes[:, 2] - boxes[:, 0] + 1 >= min_size) & (
            boxes[:, 3] - boxes[:, 1] + 1 >= min_size
        )
        boxes, fg = boxes[big], fg[big]
        order = torch.sort(fg, stable=True).indices.flip(0)
        if self.param.pre_nms_topn > 0:
            order = order[: int(self.param.pre_nms_topn)]
        boxes, fg = boxes[order], fg[order]
        again = torch.sort(fg, stable=True).indices.flip(0)  # gpu_nms sorts its input again
        return boxes[again], fg[again]

    def score_top(self, scores: torch.Tensor) -> torch.Tensor:
        return scores[:, None]

    def extra_repr(self) -> str:
        pp = self.layer_param.python_param
        native = text_format.MessageToString(self.native_param, as_one_line=True)
        phase = caffe_pb2.Phase.Name(self.phase)
        return (
            f"{pp.module}.{pp.layer} runs as a native equivalent with py-faster-rcnn's "
            f"default cfg.{phase}: {native}"
        )


# py-faster-rcnn lib/fast_rcnn/config.py defaults of cfg.{TRAIN,TEST}.RPN_PRE_NMS_TOP_N,
# RPN_POST_NMS_TOP_N, RPN_NMS_THRESH, RPN_MIN_SIZE; the layer reads cfg[str(self.phase)].
RPN_CFG = {caffe_pb2.TRAIN: (12000, 2000, 0.7, 16), caffe_pb2.TEST: (6000, 300, 0.7, 16)}


def rpn_proposal(lp: caffe_pb2.LayerParameter, bottom_shapes: Sequence[Shape]) -> CaffeLayer:
    """py-faster-rcnn's proposal layer from param_str: feat_stride (required), scales
    (default 8, 16, 32) and ratios (default 0.5, 1, 2: read by common derivatives, ignored by
    py-faster-rcnn itself); base_size 16; pre/post NMS top N, NMS threshold, min_size: cfg."""
    try:
        PyFasterRCNNProposalLayer.check_arity(lp)
        values = parse_param_str(lp)
        unknown = sorted(set(values) - {"feat_stride", "scales", "ratios"})
        if unknown:
            raise LayerParamError(
                f"param_str key(s) {unknown} are not read by py-faster-rcnn's ProposalLayer",
                hint=f"a modified proposal_layer.py cannot be served natively; {RUN_MODULE_HINT}",
            )
        if "feat_stride" not in values:
            raise LayerParamError(
                "param_str needs 'feat_stride'",
                expected="param_str: \"'feat_stride': 16\"",
                got=repr(lp.python_param.param_str),
            )
        stride = values["feat_stride"]
        if isinstance(stride, bool) or not isinstance(stride, int) or stride <= 0:
            raise LayerParamError(
                "param_str 'feat_stride' must be a positive integer", got=repr(stride)
            )
        ratios = _numbers(values.get("ratios", (0.5, 1, 2)), "ratios")
        scales = _numbers(values.get("scales", (8, 16, 32)), "scales")
        pre, post, nms, min_size = RPN_CFG[lp.phase]
        param = caffe_pb2.ProposalParameter(
            feat_stride=stride,
            base_size=16,
            min_size=min_size,
            ratio=ratios,
            scale=scales,
            pre_nms_topn=pre,
            post_nms_topn=post,
            nms_thresh=nms,
        )
        return PyFasterRCNNProposalLayer(lp, bottom_shapes, param, scales, ratios)
    except TorchCaffeError as err:
        raise err.located(layer=lp.name, layer_type=lp.type) from None


# (python_param.module, python_param.layer) -> builder of a native layer computing the same.
NATIVE_SUBSTITUTES: dict[tuple[str, str], Callable[..., CaffeLayer]] = {
    ("rpn.proposal_layer", "ProposalLayer"): rpn_proposal,
}
