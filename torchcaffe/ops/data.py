"""Data: batches of Datum records from an LMDB or LevelDB database (Caffe's DataLayer)."""

from __future__ import annotations

import os

import numpy as np

from ..data.datum import parse_datum
from ..data.db import DBReader, backend_name, open_db
from ..data.rng import for_rank
from ..data.transformer import DataTransformer
from ..errors import DataError, TorchCaffeError
from ..proto import caffe_pb2 as pb
from ..registry import register_layer
from ._data_source import BatchLoader, SourceLayer
from .base import Between


class DatumLoader(BatchLoader):
    """DataLayer::load_batch: records in key order with wrap-around, the batch shaped by its
    first record, every record transformed, labels as float."""

    def __init__(
        self,
        db: DBReader,
        transformer: DataTransformer,
        batch_size: int,
        with_labels: bool,
        phase: int,
    ) -> None:
        self.db, self.transformer = db, transformer
        self.batch_size, self.with_labels, self.phase = batch_size, with_labels, phase
        self.cursor = db.cursor()
        self.offset = 0
        self.rank, self.world_size = 0, 1

    def set_shard(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.transformer.rng = for_rank(self.transformer.rng, rank)

    def _skip(self) -> bool:
        # DataLayer::Skip: in TEST every rank reads everything (only rank 0 tests in Caffe).
        keep = self.offset % self.world_size == self.rank or self.phase == pb.TEST
        return not keep

    def _next(self) -> None:
        self.cursor.next()
        self.offset += 1

    def record(self) -> tuple[np.ndarray, int]:
        datum = parse_datum(self.cursor.value, source=self.db.path, key=self.cursor.key)
        return self.transformer.decode(datum, source=self._where()), datum.label

    def _where(self) -> str:
        return f"{self.db.path} (key {self.cursor.key.decode('utf-8', 'replace')!r})"

    def first_shape(self) -> tuple[int, ...]:
        arr, _ = self.record()
        return self.transformer.output_shape(arr.shape)

    def next_batch(self) -> list[np.ndarray]:
        data: np.ndarray | None = None
        labels = np.empty(self.batch_size, np.float32)
        for i in range(self.batch_size):
            while self._skip():
                self._next()
            arr, label = self.record()
            if data is None:
                shape = self.transformer.output_shape(arr.shape)
                data = np.empty((self.batch_size, *shape), np.float32)
            try:
                self.transformer.transform_into(arr, data[i])
            except DataError as err:
                raise err.located(path=self._where()) from None
            labels[i] = label
            self._next()
        assert data is not None
        return [data, labels] if self.with_labels else [data]


@register_layer("Data")
class DataLayer(SourceLayer):
    """Datum records from a database. Caffe type ``Data``, ``data_param`` (source, backend
    LEVELDB | LMDB, batch_size, prefetch) and ``transform_param``.

    Tops: data (batch, C, H, W) and optionally label (batch,). Records are read in key order
    and wrap around; the batch shape follows the first record of each batch. The database is
    opened read-only, relative to the working directory, and read in a background thread.
    """

    tops = Between(1, 2)
    param_field = "data_param"
    restrictions = (
        "mirror / TRAIN crop draw from an mt19937 seeded from torch's RNG (set_random_seed), "
        "not from Caffe's global RNG: the same distribution, another stream; rand_skip is "
        "read and ignored, as Caffe 1.0's data_layer.cpp does (only the DataReader of rc2 "
        "and before skipped records)"
    )

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        self._check_batch_size(p.batch_size)
        self.prefetch_depth = int(p.prefetch) if p.prefetch > 0 else 1
        where = f"{p.source}"
        backend = backend_name(p.backend)
        try:
            db = open_db(p.source, backend)
        except TorchCaffeError as err:
            raise self.error(
                f"cannot open the {backend} database {p.source!r}: {err.what}",
                hint=err.hint
                or f"data_param.source is opened relative to the working directory {os.getcwd()}",
                cls=type(err),
            ) from None
        transformer = DataTransformer(layer_param.transform_param, self.phase, where=where)
        self.loader = loader = DatumLoader(
            db, transformer, int(p.batch_size), self.num_tops > 1, self.phase
        )
        shape = loader.first_shape()
        self._top_shapes = [(int(p.batch_size), *shape)]
        if self.num_tops > 1:
            self._top_shapes.append((int(p.batch_size),))

    def close(self) -> None:
        """Stop prefetching and release the database (the layer reads no more after this)."""
        super().close()
        if isinstance(self.loader, DatumLoader):
            self.loader.db.close()
