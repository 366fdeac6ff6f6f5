"""Which param blobs a weights file is about to overwrite, so that their fillers need not run.

``torchcaffe.load(prototxt, caffemodel)`` scans the weights file before it builds the net and
builds inside ``skipping_fillers(plan)``: ``CaffeLayer.add_blob`` then allocates those blobs
uninitialized (``torch.empty``) instead of drawing filler values that the copy replaces at
once. The plan names (layer, blob index) pairs that the file really holds; every other blob,
including every blob of a layer the file lacks, still gets its filler.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

FillPlan = Mapping[str, frozenset[int]]  # layer name -> indices of blobs the file holds

_PLAN: ContextVar[FillPlan | None] = ContextVar("torchcaffe_fill_plan", default=None)


def plan_from_records(records: Iterable) -> dict[str, frozenset[int]]:
    """(layer name -> held blob indices) from ``formats.caffemodel`` LayerRecords.

    A name stored twice keeps the union (the copy writes every stored blob); a blob an HDF5
    file leaves out (``None``) is not held."""
    plan: dict[str, frozenset[int]] = {}
    for record in records:
        held = {j for j, blob in enumerate(record.blobs) if blob is not None}
        plan[record.name] = plan.get(record.name, frozenset()) | held
    return plan


@contextmanager
def skipping_fillers(plan: FillPlan | None) -> Iterator[None]:
    """Build layers with the blobs in ``plan`` left unfilled (the caller loads them next)."""
    token = _PLAN.set(plan)
    try:
        yield
    finally:
        _PLAN.reset(token)


def will_be_loaded(layer: str, index: int) -> bool:
    """Will the weights being loaded overwrite blob ``index`` of ``layer``?"""
    plan = _PLAN.get()
    return plan is not None and index in plan.get(layer, ())
