"""SourceLayer: the base of layers whose tops come from a file, a database or memory.

A subclass builds a *loader* (a plain object, not the module) whose ``next_batch()`` returns
one numpy array per top. The layer runs it in a background prefetch thread (started at the
first forward, so ``set_shard`` can still reposition the reader), or, after
``feed_from(loader)``, takes its batches from any iterable such as a torch DataLoader.
"""

from __future__ import annotations

import abc
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .. import limits
from ..data.prefetch import Prefetcher
from ..errors import DataError, TorchCaffeError
from .base import CaffeLayer, Exactly, Shape


class BatchLoader(abc.ABC):
    """Produces batches; lives in the prefetch thread once prefetching starts."""

    @abc.abstractmethod
    def next_batch(self) -> list[np.ndarray]:
        """The next batch, one array per top."""

    def set_shard(self, rank: int, world_size: int) -> None:
        raise DataError("this data source cannot be sharded")


class SourceLayer(CaffeLayer):
    bottoms = Exactly(0)
    has_backward = False
    prefetch_depth: int = 0  # 0: read in the forward call itself

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        self.loader: BatchLoader | None = None
        self._top_shapes: list[Shape] = []
        self._prefetcher: Prefetcher | None = None
        self._feed: Iterable[Any] | None = None
        self._feed_iter: Iterator[Any] | None = None
        # Carries .to(device) / .double() to the tops; not state, so not in state_dict.
        self.register_buffer("_like", torch.zeros(0), persistent=False)

    # -- param checks the file-reading layers share -------------------------------------------
    def _check_batch_size(self, batch_size: int) -> None:
        if batch_size <= 0:
            raise self.error("batch_size must be positive", expected="> 0", got=batch_size)

    def _check_resize(self, new_height: int, new_width: int, is_color: bool = True) -> None:
        """Caffe's image readers resize only when both sides are given. The resized image
        is made when the first one is read, before any top shape is known, so its size is
        checked against the limits here (OpenCV would try to allocate it)."""
        if (new_height > 0) != (new_width > 0):
            raise self.error(
                "new_height and new_width must be set together",
                expected="both 0 or both > 0",
                got=(new_height, new_width),
            )
        shape = (3 if is_color else 1, int(new_height), int(new_width))
        problem = limits.shape_problem(shape) if new_height > 0 else None
        if problem:
            raise self.error(
                f"images resized to new_height x new_width = {new_height} x {new_width} "
                f"would have shape {limits.shape_text(shape)}: {problem}",
                hint="see docs/limits.md to raise a limit for a net you trust",
            )

    # -- contract for DDP and torch users ---------------------------------------------------
    def set_shard(self, rank: int, world_size: int) -> None:
        """Read only records rank, rank + world_size, ... (call before the first forward)."""
        if not 0 <= rank < world_size:
            raise self.error("bad shard", expected=f"0 <= rank < {world_size}", got=rank)
        if self._prefetcher is not None:
            raise self.error(
                "set_shard must be called before the first forward",
                expected="no batch read yet",
                got="prefetching started",
                cls=DataError,
            )
        if self.loader is None:
            raise self.error("this layer has no reader to shard", cls=DataError)
        self.loader.set_shard(rank, world_size)

    def feed_from(self, loader: Iterable[Any]) -> None:
        """Take batches from ``loader`` (e.g. a torch DataLoader yielding one tensor per top,
        as a tuple/list, or a dict keyed by top name); it is re-iterated at its end."""
        self.close()
        self._feed, self._feed_iter = loader, None

    def close(self) -> None:
        """Stop the prefetch thread (it is a daemon and also stops with the module)."""
        if self._prefetcher is not None:
            self._prefetcher.stop()
            self._prefetcher = None

    # -- copies -----------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """Threads, open databases and iterators do not copy or pickle: a copy (deepcopy,
        torch.save) re-opens its source and reads from the first record again."""
        state = self.__dict__.copy()
        state["loader"], state["_prefetcher"], state["_feed_iter"] = None, None, None
        state["_reopen"] = self.loader is not None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        reopen = state.pop("_reopen", False)
        self.__dict__.update(state)
        if reopen:
            self.loader = type(self)(self.layer_param, self.bottom_shapes).loader

    # -- forward ----------------------------------------------------------------------------
    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        return list(self._top_shapes)

    def _next_arrays(self) -> Sequence[Any]:
        """The next batch; a reader's error (a bad record or image found after set-up, in the
        prefetch thread or here) is located at this layer, as one found at set-up is."""
        try:
            return self._read_next()
        except TorchCaffeError as err:
            raise err.located(layer=self.name, layer_type=self.caffe_type) from None

    def _read_next(self) -> Sequence[Any]:
        if self._feed is not None:
            return self._next_fed()
        assert self.loader is not None
        if self.prefetch_depth <= 0:
            return self.loader.next_batch()
        if self._prefetcher is None:
            self._prefetcher = Prefetcher(
                self.loader.next_batch, self.prefetch_depth, name=f"torchcaffe-{self.name}"
            )
            weakref.finalize(self, self._prefetcher.stop)
        return self._prefetcher.get()

    def _next_fed(self) -> Sequence[Any]:
        for attempt in range(2):
            if self._feed_iter is None:
                self._feed_iter = iter(self._feed)  # type: ignore[arg-type]
            try:
                batch = next(self._feed_iter)
                break
            except StopIteration:
                self._feed_iter = None
                if attempt:
                    raise self.error("the fed loader yields no batches", cls=DataError) from None
        tops = list(self.layer_param.top)
        if isinstance(batch, dict):
            missing = [t for t in tops if t not in batch]
            if missing:
                raise self.error("fed batch lacks tops", expected=tops, got=sorted(batch))
            return [batch[t] for t in tops]
        if isinstance(batch, (torch.Tensor, np.ndarray)):
            batch = [batch]
        if len(batch) < len(tops):
            raise self.error(
                "fed batch has fewer items than the layer has tops",
                expected=len(tops),
                got=len(batch),
            )
        return list(batch)[: len(tops)]

    def forward(self):
        like: torch.Tensor = self._like  # type: ignore[assignment]
        tops = tuple(
            torch.as_tensor(a).to(device=like.device, dtype=like.dtype) for a in self._next_arrays()
        )
        return tops if len(tops) > 1 else tops[0]
