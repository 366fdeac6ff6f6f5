"""The RNG Caffe's data code draws from: a boost::mt19937 stream, ``draw() % n``.

Caffe seeds each DataTransformer (and each shuffling layer) with one draw from its global
RNG. Here that seed is one draw from torch's default generator, so ``caffe.set_random_seed``
(torch.manual_seed) makes every choice reproducible; the choices are distributed as Caffe's
but are not Caffe's exact stream, whose global RNG state depends on every earlier draw.
"""

from __future__ import annotations

from typing import overload

import numpy as np
import torch


def fresh_seed() -> int:
    """A 32-bit seed drawn from torch's default generator (follows set_random_seed)."""
    return int(torch.randint(0, 2**32, (1,), dtype=torch.int64).item())


@overload
def for_rank(rng: CaffeRNG, rank: int) -> CaffeRNG: ...
@overload
def for_rank(rng: None, rank: int) -> None: ...
def for_rank(rng: CaffeRNG | None, rank: int) -> CaffeRNG | None:
    """The stream rank ``rank`` of a multi-process run draws from. Caffe seeds solver r with
    ``random_seed + r``, so each rank mirrors, crops and shuffles on its own; ranks seeded
    alike would augment their records identically. Rank 0 keeps its stream as it is."""
    if rng is None or rank == 0:
        return rng
    return CaffeRNG(rng.seed + rank)


class CaffeRNG:
    """mt19937 seeded as ``boost::mt19937(seed)``; ``rand(n)`` is Caffe's ``(*rng)() % n``."""

    def __init__(self, seed: int | None = None) -> None:
        self.seed = fresh_seed() if seed is None else int(seed) & 0xFFFFFFFF
        # RandomState(int) seeds MT19937 with init_genrand, exactly as boost/std mt19937 do.
        self._bits = np.random.RandomState(self.seed)._bit_generator

    def draw(self) -> int:
        return int(self._bits.random_raw())

    def rand(self, n: int) -> int:
        if n <= 0:
            raise ValueError(f"rand(n) needs n > 0, got {n}")
        return self.draw() % n

    def shuffle(self, items: list) -> None:
        """caffe::shuffle: Fisher-Yates from the back, index uniform in [0, i]."""
        for i in range(len(items) - 1, 0, -1):
            j = self._uniform_int(i)
            items[i], items[j] = items[j], items[i]

    def _uniform_int(self, high: int) -> int:
        """Uniform in [0, high] as boost::uniform_int maps mt19937's 32-bit draws (caffe::shuffle
        uses it): the draw divided by a bucket size, a result past ``high`` drawn again."""
        brange = (1 << 32) - 1
        bucket = brange // (high + 1)
        if brange % (high + 1) == high:  # (brange + 1) is a multiple of the range
            bucket += 1
        while True:
            result = self.draw() // bucket
            if result <= high:
                return result
