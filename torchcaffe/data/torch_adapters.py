"""Caffe's data sources inside ordinary PyTorch pipelines.

``DatumDataset`` is a map-style ``torch.utils.data.Dataset`` over an LMDB/LevelDB of Datums; it
lists the keys once and opens the database lazily in each process, so it works with
``DataLoader(num_workers > 0)`` (an LMDB environment must not cross a fork).
``CaffeTransform`` is Caffe's DataTransformer as a torch transform; in a DataLoader worker it
reseeds its mirror/crop RNG from the worker's seed, so workers do not repeat each other's draws.
To feed a net's Data layer from a DataLoader, see ``SourceLayer.feed_from``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from ..proto import caffe_pb2 as pb
from .datum import datum_to_array, parse_datum
from .db import DBReader, open_db
from .rng import CaffeRNG
from .transformer import DataTransformer


class CaffeTransform:
    """``transform(chw_array) -> float32 tensor`` with Caffe's TransformationParameter.

    Give a ``TransformationParameter`` or its fields as keywords
    (``CaffeTransform(crop_size=227, mirror=True, mean_file="mean.binaryproto")``).
    """

    def __init__(
        self,
        param: pb.TransformationParameter | None = None,
        phase: int | str = pb.TRAIN,
        **fields: Any,
    ) -> None:
        if param is None:
            param = pb.TransformationParameter(**fields)
        if isinstance(phase, str):
            phase = pb.TRAIN if phase.lower() == "train" else pb.TEST
        self.transformer = DataTransformer(param, phase, where="CaffeTransform")
        self._pid = os.getpid()

    def _reseed_in_worker(self) -> None:
        if self._pid == os.getpid() or self.transformer.rng is None:
            return
        self._pid = os.getpid()
        info = torch.utils.data.get_worker_info()
        seed = info.seed if info is not None else None
        self.transformer.rng = CaffeRNG(seed)

    def __call__(self, x: np.ndarray | torch.Tensor) -> torch.Tensor:
        self._reseed_in_worker()
        if isinstance(x, torch.Tensor):
            x = x.numpy()
        return torch.from_numpy(self.transformer(np.asarray(x)))


class DatumDataset(torch.utils.data.Dataset):
    """(data, label) per record of a Datum database, in key order.

    ``data`` is the record as a CxHxW tensor (uint8 pixels, decoded when encoded, or float
    data), or whatever ``transform`` makes of its array; ``label`` is the Datum's label.
    """

    def __init__(
        self,
        source: str | os.PathLike,
        backend: int | str = "lmdb",
        transform: Any = None,
        *,
        force_color: bool = False,
        force_gray: bool = False,
    ) -> None:
        self.source, self.backend, self.transform = os.fspath(source), backend, transform
        self.force_color, self.force_gray = force_color, force_gray
        with open_db(self.source, backend) as db:
            self.keys = db.keys()
        self._db: DBReader | None = None
        self._pid = -1

    def __len__(self) -> int:
        return len(self.keys)

    def _reader(self) -> DBReader:
        if self._db is None or self._pid != os.getpid():
            self._db = open_db(self.source, self.backend)  # per process: no env across fork
            self._pid = os.getpid()
        return self._db

    def __getitem__(self, index: int) -> tuple[Any, int]:
        key = self.keys[index]
        datum = parse_datum(self._reader().get(key), source=self.source, key=key)
        arr = datum_to_array(
            datum, force_color=self.force_color, force_gray=self.force_gray, source=self.source
        )
        data = self.transform(arr) if self.transform is not None else torch.from_numpy(arr.copy())
        return data, int(datum.label)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_db"], state["_pid"] = None, -1  # spawned workers open their own
        return state
