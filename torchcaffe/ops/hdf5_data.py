"""HDF5Data: rows of named datasets, read from a list of HDF5 files one batch at a time."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch

from .. import limits
from ..errors import DataError
from ..registry import register_layer
from .base import AtLeast, CaffeLayer, Exactly, Shape


@register_layer("HDF5Data")
class HDF5DataLayer(CaffeLayer):
    """Rows from HDF5 files. Caffe type ``HDF5Data``, ``hdf5_data_param`` (source: a text file
    of whitespace-separated .h5 names, batch_size, shuffle = false).

    Each top reads the dataset of the same name; all of a file's datasets have the same number
    of rows. Top shape: (batch_size,) + the dataset's row shape. Only one file is held in
    memory; a batch runs on across files and wraps from the last file to the first, as
    Caffe's Next(). ``source`` and the names in it are opened relative to the working
    directory, as Caffe opens them. Integer datasets (labels) come out as float.
    Differs from torch: a stateful reader, not a function of its inputs (no backward).
    """

    bottoms = Exactly(0)
    tops = AtLeast(1)
    param_field = "hdf5_data_param"
    has_backward = False
    _data: list[torch.Tensor]  # the current file's datasets, one per top
    _like: torch.Tensor  # buffer: carries .to(device) / .double() to the tops
    restrictions = (
        "shuffle draws from torch's RNG (seeded by set_random_seed), not "
        "std::random_shuffle: same rows per epoch, another order"
    )

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        if layer_param.HasField("transform_param"):
            raise self.error(
                "HDF5Data does not transform data",
                expected="no transform_param",
                got="a transform_param",
            )
        p = self.param
        if p.batch_size <= 0:
            raise self.error(
                "batch_size must be positive", expected="batch_size > 0", got=p.batch_size
            )
        self.batch_size = int(p.batch_size)
        self.shuffle = bool(p.shuffle)
        self.top_names = list(layer_param.top)
        seed = int(torch.randint(0, 2**62, (1,)).item())  # follows torch.manual_seed
        self._generator = torch.Generator().manual_seed(seed)
        self.files = self._read_source(p.source)
        self._file_order = self._permutation(len(self.files))
        self._file = 0
        self._load(self.files[self._file_order[0]])
        self._row = 0
        self._offset = 0  # rows passed so far, for Caffe's multi-solver Skip()
        self._rank, self._world_size = 0, 1
        self._top_shapes = [(self.batch_size,) + tuple(d.shape[1:]) for d in self._data]
        # Carries .to(device) / .double() to the tops; not state, so not in state_dict.
        self.register_buffer("_like", torch.zeros(0), persistent=False)

    # -- files --------------------------------------------------------------------------------
    def _read_source(self, source: str) -> list[str]:
        try:
            with open(source, encoding="utf-8", errors="surrogateescape") as f:
                names = f.read().split()  # Caffe reads with `>>`: whitespace-separated
        except OSError as err:
            raise self.error(
                f"cannot open the source list {source!r} ({err.strerror})",
                expected="a text file of .h5 names, relative to the working "
                f"directory {os.getcwd()}",
                got=source,
                cls=DataError,
            ) from None
        if not names:
            raise self.error(
                f"the source list {source!r} names no HDF5 file",
                expected="at least 1 file name",
                got=0,
                cls=DataError,
            )
        return names

    def _load(self, filename: str) -> None:
        """Caffe's LoadHDF5FileData: every top's dataset, equal row counts, fresh permutation."""
        import h5py

        try:
            h5 = h5py.File(filename, "r")
        except OSError as err:
            raise self.error(f"cannot open HDF5 file {filename!r} ({err})", cls=DataError) from None
        data = []
        with h5:
            for name in self.top_names:
                data.append(self._dataset(h5, filename, name))
        rows = data[0].shape[0]
        if rows == 0:
            raise self.error(
                f"{filename}: dataset '{self.top_names[0]}' has no rows",
                expected=">= 1 row",
                got=0,
                cls=DataError,
            )
        for name, d in zip(self.top_names, data):
            if d.shape[0] != rows:
                raise self.error(
                    f"{filename}: dataset '{name}' has another number of rows "
                    f"than '{self.top_names[0]}'",
                    expected=rows,
                    got=d.shape[0],
                    cls=DataError,
                )
        if hasattr(self, "_top_shapes"):
            for name, d, shape in zip(self.top_names, data, self._top_shapes):
                if tuple(d.shape[1:]) != shape[1:]:
                    raise self.error(
                        f"{filename}: dataset '{name}' rows differ in shape from the first file's",
                        expected=shape[1:],
                        got=tuple(d.shape[1:]),
                        cls=DataError,
                    )
        self._data = data
        self._rows = rows
        self._order = self._permutation(rows)

    def _dataset(self, h5, filename: str, name: str) -> torch.Tensor:
        if name not in h5 or not hasattr(h5[name], "dtype"):
            what = "a group, not a dataset" if name in h5 else "missing"
            raise self.error(
                f"{filename}: no dataset named '{name}' (one per top): '{name}' is {what}",
                expected=f"datasets {self.top_names}",
                got=sorted(h5.keys()),
                cls=DataError,
            )
        ds = h5[name]
        if ds.ndim < 1:
            raise self.error(
                f"{filename}: dataset '{name}' needs at least 1 axis",
                expected=">= 1 axis",
                got=ds.shape,
                cls=DataError,
            )
        kind = ds.dtype.kind
        if kind not in "fiub":
            raise self.error(
                f"{filename}: dataset '{name}' is not numeric",
                expected="float or integer data",
                got=str(ds.dtype),
                cls=DataError,
            )
        # Caffe's Blob::Reshape refuses the dataset's blob before reading it; a dataset can
        # declare far more than its file holds (HDF5 allocates storage lazily)
        problem = limits.shape_problem(tuple(int(d) for d in ds.shape))
        if problem:
            raise self.error(
                f"{filename}: dataset '{name}' of shape {limits.shape_text(ds.shape)}: {problem}",
                hint="see docs/limits.md to raise a limit for a file you trust",
                cls=DataError,
            )
        array = ds[()]
        if kind == "f" and array.dtype.itemsize >= 4:
            return torch.from_numpy(np.ascontiguousarray(array))
        # Integers exactly as float (wide ones as double); half floats widened.
        wide = kind in "iu" and array.dtype.itemsize >= 4
        return torch.from_numpy(np.ascontiguousarray(array, np.float64 if wide else np.float32))

    def _permutation(self, n: int) -> torch.Tensor:
        if self.shuffle:
            return torch.randperm(n, generator=self._generator)
        return torch.arange(n)

    def _next_file(self) -> None:
        """End of the current file's rows: the next file (reshuffled at wrap), row 0."""
        if len(self.files) > 1:
            self._file += 1
            if self._file == len(self.files):
                self._file = 0
                if self.shuffle:
                    self._file_order = self._permutation(len(self.files))
            self._load(self.files[self._file_order[self._file]])
        self._row = 0
        if self.shuffle:
            self._order = self._permutation(self._rows)

    # -- sharding (Caffe's Skip() with solver_count > 1) ------------------------------------
    def set_shard(self, rank: int, world_size: int) -> None:
        """Read only rows ``rank, rank + W, rank + 2W, ...`` of the stream (the TRAIN phase of
        a W-process run; Caffe's TEST phase runs on rank 0 alone and reads everything)."""
        if world_size < 1 or not 0 <= rank < world_size:
            raise self.error("bad shard", expected="0 <= rank < world_size", got=(rank, world_size))
        self._rank, self._world_size = int(rank), int(world_size)

    def _take(self, need: int) -> tuple[torch.Tensor, int]:
        """Up to ``need`` of this shard's row indices from the current file; advances."""
        left = self._rows - self._row
        first = (self._rank - self._offset) % self._world_size
        if first >= left:
            passed, picked = left, torch.zeros(0, dtype=torch.long)
        else:
            take = min(need, (left - first + self._world_size - 1) // self._world_size)
            stop = first + self._world_size * (take - 1) + 1
            positions = torch.arange(first, stop, self._world_size)
            picked = self._order[self._row + positions]
            passed = left if take * self._world_size >= left - first else stop
        self._row += passed
        self._offset += passed
        return picked, passed

    # -- the contract -------------------------------------------------------------------------
    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        return list(self._top_shapes)

    def forward(self):
        chunks: list[list[torch.Tensor]] = [[] for _ in self.top_names]
        need = self.batch_size
        while need:
            if self._world_size == 1:
                take = min(need, self._rows - self._row)
                rows = self._order[self._row : self._row + take]
                self._row += take
                self._offset += take
            else:
                rows, _ = self._take(need)
                take = len(rows)
            for out, data in zip(chunks, self._data):
                out.append(data[rows])
            need -= take
            if self._row == self._rows:
                self._next_file()
        like = self._like
        tops = tuple(torch.cat(c).to(device=like.device, dtype=like.dtype) for c in chunks)
        return tops if len(tops) > 1 else tops[0]
