"""DummyData: tops of given shapes filled by fillers (Caffe's DummyDataLayer)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from .. import limits
from ..proto import caffe_pb2 as pb
from ..registry import register_layer
from .base import AtLeast, CaffeLayer, Exactly, Shape
from .fillers import check_filler, fill_

# layer name -> {top index: tensor}: what a constant top holds now, where a caller keeps it
# (the Caffe face: Caffe fills a constant top once at setup and never again, so a value a
# script writes into it, or an in-place layer's, stays for the next forward)
_HELD_TOPS: ContextVar[Mapping[str, Mapping[int, torch.Tensor]] | None] = ContextVar(
    "torchcaffe_dummy_data_held_tops", default=None
)


@contextmanager
def holding_tops(held: Mapping[str, Mapping[int, torch.Tensor]]) -> Iterator[None]:
    """Within: the DummyData layers named in ``held`` return those tensors as their constant
    tops instead of filling them again."""
    token = _HELD_TOPS.set(held)
    try:
        yield
    finally:
        _HELD_TOPS.reset(token)


@register_layer("DummyData")
class DummyDataLayer(CaffeLayer):
    """Caffe type ``DummyData``, ``dummy_data_param`` (data_filler: 0, 1 or one per top;
    shape: 1 or one per top, or the legacy num/channels/height/width, each 1 or one per top).

    Tops with a constant filler (the default: constant 0) are filled once at setup; the
    others are refilled at every forward, as Caffe's refill_ flags do.
    """

    bottoms = Exactly(0)
    tops = AtLeast(1)
    param_field = "dummy_data_param"
    has_backward = False

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p, n = self.param, self.num_tops
        if len(p.data_filler) not in (0, 1, n):
            raise self.error(
                "give 0, 1 or one data_filler per top",
                expected=f"0, 1 or {n}",
                got=len(p.data_filler),
            )
        legacy = [p.num, p.channels, p.height, p.width]
        if any(len(f) for f in legacy):
            if len(p.shape):
                raise self.error("both shape and legacy num/channels/height/width given")
            for field, values in zip(("num", "channels", "height", "width"), legacy):
                if len(values) not in (1, n):
                    raise self.error(
                        f"give {field} once or once per top",
                        expected=f"1 or {n}",
                        got=len(values),
                    )
            self.shapes = [
                tuple(int(v[0] if len(v) == 1 else v[i]) for v in legacy) for i in range(n)
            ]
        else:
            if len(p.shape) not in (1, n):
                raise self.error(
                    "give shape once or once per top", expected=f"1 or {n}", got=len(p.shape)
                )
            self.shapes = [
                tuple(int(d) for d in p.shape[0 if len(p.shape) == 1 else i].dim) for i in range(n)
            ]
        for s in self.shapes:
            if any(d < 0 for d in s):
                raise self.error("negative top dimension", expected=">= 0", got=s)
            problem = limits.shape_problem(s)
            if problem:  # before a constant top is made below: the shape is the file's
                raise self.error(
                    f"top shape {limits.shape_text(s)}: {problem}",
                    hint="see docs/limits.md to raise a limit for a net you trust",
                )
        if len(p.data_filler) == 0:
            fillers = [pb.FillerParameter(type="constant", value=0)] * n
        elif len(p.data_filler) == 1:
            fillers = [p.data_filler[0]] * n
        else:
            fillers = list(p.data_filler)
        for f in fillers:
            try:
                check_filler(f)
            except Exception as err:
                raise self.error(f"bad data_filler: {err}") from None
        self.fillers = fillers
        self.constant = {}
        for i, (s, f) in enumerate(zip(self.shapes, fillers)):
            if f.type == "constant":
                self.constant[i] = torch.full(s, f.value, dtype=torch.float32)
        self.register_buffer("_like", torch.zeros(0), persistent=False)

    def output_shapes(self, bottom_shapes) -> list[Shape]:
        return list(self.shapes)

    def forward(self):
        like: torch.Tensor = self._like  # type: ignore[assignment]
        held = (_HELD_TOPS.get() or {}).get(self.name, {})
        tops = []
        for i, (s, f) in enumerate(zip(self.shapes, self.fillers)):
            if i in held:  # the Caffe face's blob: Caffe fills a constant top once, at setup
                t = held[i]
            elif i in self.constant:
                t = self.constant[i].to(device=like.device, dtype=like.dtype)
            else:
                t = torch.empty(s, device=like.device, dtype=like.dtype)
                if t.numel():
                    fill_(t, f)
            tops.append(t)
        return tuple(tops) if len(tops) > 1 else tops[0]
