"""Key/value databases of serialized records, as Caffe's db.hpp: LMDB and LevelDB.

Readers never modify a database. LMDB opens read-only without a lock file (``lock=False``;
Caffe's reader would create ``lock.mdb``). LevelDB has no read-only mode: opening one replays
its write-ahead log into a new table and rewrites the manifest, so the reader opens a private
scratch view instead (tables symlinked, small metadata files copied) and removes it on close.

Writers build the database in a temporary directory beside the target and rename it into
place at the end, so an interrupted run leaves nothing under the target name. Records go in
transactions of 1000, as Caffe's tools commit them.
"""

from __future__ import annotations

import abc
import contextlib
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Iterator
from typing import Any

from ..errors import DataError, UnsupportedError
from ..formats.atomic import current_umask

BACKENDS = ("lmdb", "leveldb")
COMMIT_EVERY = 1000


def backend_name(backend: int | str) -> str:
    """DataParameter.DB enum (LEVELDB = 0, LMDB = 1) or a name -> 'lmdb' / 'leveldb'."""
    if isinstance(backend, str):
        name = backend.lower()
    else:
        name = {0: "leveldb", 1: "lmdb"}.get(int(backend), str(backend))
    if name not in BACKENDS:
        raise DataError("unknown database backend", expected="lmdb or leveldb", got=backend)
    return name


def _plyvel() -> Any:
    try:
        import plyvel
    except ImportError:
        raise UnsupportedError(
            "LevelDB databases need the plyvel package, which is not installed",
            hint="pip install 'torchcaffe[leveldb]'",
        ) from None
    return plyvel


class DBReader(abc.ABC):
    """A read-only database: ``len``, ``items()`` in key order, and a wrapping cursor."""

    path: str

    @abc.abstractmethod
    def items(self, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs in key order, from ``start`` (or the first key)."""

    @abc.abstractmethod
    def get(self, key: bytes) -> bytes:
        """The value stored at ``key``."""

    def keys(self) -> list[bytes]:
        return [k for k, _ in self.items()]

    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of records."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the environment / handle."""

    def cursor(self) -> WrapCursor:
        return WrapCursor(self)

    def __enter__(self) -> DBReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WrapCursor:
    """Caffe's DataLayer walk: records in key order, back to the first after the last."""

    def __init__(self, db: DBReader) -> None:
        self.db = db
        self._it = db.items()
        self._current = self._first()

    def _first(self) -> tuple[bytes, bytes]:
        self._it = self.db.items()
        try:
            return next(self._it)
        except StopIteration:
            raise DataError("the database holds no records", path=self.db.path) from None

    @property
    def key(self) -> bytes:
        return self._current[0]

    @property
    def value(self) -> bytes:
        return self._current[1]

    def next(self) -> bool:
        """Advance; returns True when it wrapped to the first record."""
        try:
            self._current = next(self._it)
            return False
        except StopIteration:
            self._current = self._first()
            return True


# (pid, realpath, the data file's device and inode) -> [env, users]: a database deleted and
# written again at the same path is another file, which a new reader must not take the old
# mapping for (Caffe's layers each open their own)
_LMDB_ENVS: dict[tuple[int, str, int, int], list[Any]] = {}
_LMDB_LOCK = threading.Lock()


def _lmdb_key(path: str) -> tuple[int, str, int, int]:
    data = os.path.join(path, "data.mdb") if os.path.isdir(path) else path
    st = os.stat(data)
    return os.getpid(), os.path.realpath(path), st.st_dev, st.st_ino


def _lmdb_env(path: str) -> tuple[Any, tuple[int, str, int, int]]:
    """One read-only environment per database file and process (py-lmdb refuses a second
    open of the same file; a forked worker must open its own), and the key to release it by
    (kept by the reader: the working directory may change before it closes)."""
    import lmdb

    key = _lmdb_key(path)
    with _LMDB_LOCK:
        entry = _LMDB_ENVS.get(key)
        if entry is None:
            env = lmdb.open(
                path,
                readonly=True,
                lock=False,
                subdir=os.path.isdir(path),
                readahead=False,
                meminit=False,
                max_readers=1024,
            )
            entry = _LMDB_ENVS[key] = [env, 0]
        entry[1] += 1
        return entry[0], key


def _lmdb_release(key: tuple[int, str, int, int]) -> None:
    with _LMDB_LOCK:
        entry = _LMDB_ENVS.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            entry[0].close()
            del _LMDB_ENVS[key]


def _forget_envs_in_child() -> None:
    """After fork: the inherited environments belong to the parent. py-lmdb refuses to open a
    file it believes open, so close the child's copies (read-only, lock-free: nothing of the
    parent's is released) and let readers in the child open their own."""
    for env, _ in _LMDB_ENVS.values():
        with contextlib.suppress(Exception):
            env.close()
    _LMDB_ENVS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_envs_in_child)


class LMDBReader(DBReader):
    def __init__(self, path: str) -> None:
        import lmdb

        self.path = path
        self._open = False
        if not os.path.exists(path):
            raise DataError("LMDB database not found", path=path, expected="an LMDB directory")
        try:
            self.env, self._key = _lmdb_env(path)
        except FileNotFoundError:
            raise DataError("LMDB database not found", path=path, expected="data.mdb") from None
        except lmdb.Error as err:
            raise DataError(f"cannot open LMDB database ({err})", path=path) from None
        self._open, self._pid = True, os.getpid()
        try:
            self._check_whole()
        except BaseException:
            self.close()
            raise

    def _check_whole(self) -> None:
        """A data file shorter than its own meta page says (a copy cut short): LMDB maps the
        file and would touch a page past its end, which kills the process (SIGBUS)."""
        data = os.path.join(self.path, "data.mdb") if os.path.isdir(self.path) else self.path
        needed = (int(self.env.info()["last_pgno"]) + 1) * int(self.env.stat()["psize"])
        size = os.path.getsize(data)
        if size < needed:
            raise DataError(
                "LMDB database is truncated (a copy cut short?)",
                path=data,
                expected=f"at least {needed} bytes, as its header says",
                got=f"{size} bytes",
            )

    def items(self, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        import lmdb

        try:
            with self.env.begin(buffers=False) as txn:
                cur = txn.cursor()
                ok = cur.set_range(start) if start is not None else cur.first()
                while ok:
                    yield cur.key(), cur.value()
                    ok = cur.next()
        except lmdb.Error as err:
            raise DataError(f"cannot read LMDB database ({err})", path=self.path) from None

    def get(self, key: bytes) -> bytes:
        import lmdb

        try:
            with self.env.begin(buffers=False) as txn:
                value = txn.get(key)
        except lmdb.Error as err:
            raise DataError(f"cannot read LMDB database ({err})", path=self.path) from None
        if value is None:
            raise DataError(f"no record with key {key!r}", path=self.path)
        return value

    def __len__(self) -> int:
        return int(self.env.stat()["entries"])

    def close(self) -> None:
        if self._open:
            self._open = False
            if self._pid == os.getpid():  # a forked copy owns no reference
                _lmdb_release(self._key)

    def __del__(self) -> None:
        self.close()


class LevelDBReader(DBReader):
    def __init__(self, path: str) -> None:
        plyvel = _plyvel()
        self.path = path
        if not os.path.isfile(os.path.join(path, "CURRENT")):
            raise DataError("LevelDB database not found", path=path, expected="a LevelDB directory")
        self._view = _scratch_view(path)
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._view, True)
        try:
            self.db = plyvel.DB(self._view, create_if_missing=False, paranoid_checks=True)
        except plyvel.Error as err:
            self._cleanup()
            raise DataError(f"cannot open LevelDB database ({err})", path=path) from None

    def items(self, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        plyvel = _plyvel()
        try:
            with self.db.iterator(start=start) as it:
                yield from it
        except plyvel.Error as err:
            raise DataError(f"cannot read LevelDB database ({err})", path=self.path) from None

    def get(self, key: bytes) -> bytes:
        value = self.db.get(key)
        if value is None:
            raise DataError(f"no record with key {key!r}", path=self.path)
        return value

    def __len__(self) -> int:
        return sum(1 for _ in self.db.iterator(include_value=False))

    def close(self) -> None:
        if not self.db.closed:
            self.db.close()
        self._cleanup()


def _scratch_view(path: str) -> str:
    """A private LevelDB directory: immutable tables linked, everything else copied."""
    view = tempfile.mkdtemp(prefix="torchcaffe-leveldb-")
    for name in os.listdir(path):
        src = os.path.join(path, name)
        if name in ("LOCK",) or not os.path.isfile(src):
            continue
        if name.endswith((".ldb", ".sst")):
            os.symlink(os.path.abspath(src), os.path.join(view, name))
        else:
            shutil.copy2(src, os.path.join(view, name))
    return view


def open_db(path: str | os.PathLike, backend: int | str = "lmdb") -> DBReader:
    """Open a database read-only (``backend``: DataParameter.DB value or 'lmdb'/'leveldb')."""
    name = os.fspath(path)
    if backend_name(backend) == "lmdb":
        return LMDBReader(name)
    return LevelDBReader(name)


# -- writing ----------------------------------------------------------------------------------
class DBWriter:
    """A new database, built beside ``path`` and renamed into place by ``commit``."""

    def __init__(self, path: str | os.PathLike, backend: int | str = "lmdb") -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.backend = backend_name(backend)
        if os.path.lexists(self.path):
            raise DataError(
                "the output database already exists",
                path=self.path,
                hint="remove it or pick "
                "another name (Caffe's tools refuse to overwrite a database too)",
            )
        parent = os.path.dirname(self.path)
        if not os.path.isdir(parent):
            raise DataError("the output directory does not exist", path=parent)
        self.tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(self.path)}.", dir=parent)
        self._pending: list[tuple[bytes, bytes]] = []
        self._done = False
        if self.backend == "lmdb":
            import lmdb

            self._map_size = 1 << 24
            self.env = lmdb.open(self.tmp, map_size=self._map_size, subdir=True)
        else:
            self.db = _plyvel().DB(self.tmp, create_if_missing=True, error_if_exists=False)

    def put(self, key: bytes, value: bytes) -> None:
        self._pending.append((key, value))
        if len(self._pending) >= COMMIT_EVERY:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        if self.backend == "lmdb":
            self._lmdb_commit()
        else:
            with self.db.write_batch() as batch:
                for k, v in self._pending:
                    batch.put(k, v)
        self._pending = []

    def _lmdb_commit(self) -> None:
        import lmdb

        while True:
            try:
                with self.env.begin(write=True) as txn:
                    for k, v in self._pending:
                        txn.put(k, v)
                return
            except lmdb.MapFullError:  # Caffe's LMDBTransaction doubles the map and retries
                self._map_size *= 2
                self.env.set_mapsize(self._map_size)

    def commit(self) -> str:
        """Write what is pending, close, and move the database to its name."""
        self.flush()
        self._close()
        if os.path.lexists(self.path):
            self.abort()
            raise DataError("the output database appeared while writing", path=self.path)
        # the folder's mode as Caffe's tools make it (mkdtemp gave 0700): LMDB's
        # mkdir(source, 0744), LevelDB's 0755, both under the umask
        os.chmod(self.tmp, (0o744 if self.backend == "lmdb" else 0o755) & ~current_umask())
        os.rename(self.tmp, self.path)
        self._done = True
        return self.path

    def _close(self) -> None:
        if self.backend == "lmdb":
            self.env.close()
        elif not self.db.closed:
            self.db.close()

    def abort(self) -> None:
        """Drop the partial database (the target name was never used)."""
        if self._done:
            return
        with contextlib.suppress(Exception):
            self._close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._done = True

    def __enter__(self) -> DBWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None and not self._done:
            self.commit()
        else:
            self.abort()
