"""Seeded mutation fuzzing: case generation, the per-case bounds and the outcome check.

Each format's test draws ``cases()`` inputs from a seeded ``random.Random`` (case ``i`` of a
format is reproducible from the format name and ``i`` alone), runs the loader on each under a
wall-clock alarm and an address-space cap, and records every *bad* outcome: an exception that
is not a ``TorchCaffeError``, a hang past the alarm, an allocation past the cap, or a successful
load that differs from what the reference decoder (protobuf's own parser, or h5py) reads from
the same bytes. The test fails listing the bad cases with their seeds.

CI mode runs 2,000 cases per format; ``TORCHCAFFE_FUZZ=long`` runs 50,000 (or
``TORCHCAFFE_FUZZ=<n>`` exactly n).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from torchcaffe.errors import TorchCaffeError
from torchcaffe.formats.wire import encode_varint, len_field_header

CI_CASES = 2000
LONG_CASES = 50_000
CASE_SECONDS = 20  # a hang guard, far above any real case (the slowest take milliseconds)
MEMORY_HEADROOM = 3 * 2**30  # address space a case may add on top of the process's own

INTERESTING_INTS = [
    0, 1, -1, 2, 3, 7, 32, 33, 255, 256, 65535, 2**31 - 1, 2**31, -(2**31), 2**32 - 1,
    2**32, 2**62, 2**63 - 1, -(2**63), 10**6, 10**9,
]  # fmt: skip
INTERESTING_TEXT = [
    "0", "-1", "1", "2", "3", "33", "2147483647", "-2147483648", "4294967295", "4294967296",
    "9223372036854775807", "-9223372036854775808", "18446744073709551615", "1e309", "-1e309",
    "inf", "-inf", "nan", "1e-45", "0.0", "1000000", "true", "false",
]  # fmt: skip


def case_count() -> int:
    mode = os.environ.get("TORCHCAFFE_FUZZ", "").strip().lower()
    if mode == "long":
        return LONG_CASES
    if mode.isdigit():
        return int(mode)
    return CI_CASES


def rng_for(fmt: str, index: int) -> random.Random:
    return random.Random(zlib.crc32(fmt.encode()) * 1_000_003 + index)


# -- byte-level mutations ---------------------------------------------------------------------
def mutate_bytes(rng: random.Random, data: bytes, corpus: list[bytes]) -> tuple[bytes, str]:
    """One to three random byte-level mutations; returns the bytes and what was done."""
    ops = []
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        op = rng.choice(_BYTE_OPS)
        buf = bytearray(op(rng, bytes(buf), corpus))
        ops.append(op.__name__)
    return bytes(buf), "+".join(ops)


def truncate(rng, data, corpus):
    return data[: rng.randrange(len(data) + 1)] if data else data


def flip_bits(rng, data, corpus):
    if not data:
        return data
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(buf))
        buf[i] ^= 1 << rng.randrange(8)
    return bytes(buf)


def set_bytes(rng, data, corpus):
    if not data:
        return data
    buf = bytearray(data)
    i = rng.randrange(len(buf))
    for j in range(i, min(len(buf), i + rng.randint(1, 4))):
        buf[j] = rng.choice((0x00, 0xFF, 0x7F, 0x80, 0x01, rng.randrange(256)))
    return bytes(buf)


def insert_random(rng, data, corpus):
    i = rng.randrange(len(data) + 1)
    return data[:i] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 16))) + data[i:]


def delete_range(rng, data, corpus):
    if not data:
        return data
    i = rng.randrange(len(data))
    return data[:i] + data[i + rng.randint(1, 32) :]


def duplicate_range(rng, data, corpus):
    if not data:
        return data
    i = rng.randrange(len(data))
    j = min(len(data), i + rng.randint(1, 64))
    k = rng.randrange(len(data) + 1)
    return data[:k] + data[i:j] + data[k:]


def huge_length_field(rng, data, corpus):
    """A length-delimited field that declares far more bytes than follow (or a huge shape)."""
    number = rng.choice((1, 2, 5, 6, 7, 8, 100, 2, 50))
    length = rng.choice((2**31 - 1, 2**32 + 5, 2**62, 2**63, 10**6, len(data) + 1))
    i = rng.randrange(len(data) + 1)
    return data[:i] + len_field_header(number, length) + data[i:]


def huge_varint_field(rng, data, corpus):
    number = rng.choice((1, 2, 3, 4, 10, 11))
    value = rng.choice(INTERESTING_INTS)
    field_bytes = encode_varint((number << 3) | 0) + encode_varint(value)
    i = rng.randrange(len(data) + 1)
    return data[:i] + field_bytes + data[i:]


def splice_other(rng, data, corpus):
    """Part of another corpus entry (another message type: the "wrong message" case)."""
    other = rng.choice(corpus)
    if not other:
        return data
    i = rng.randrange(len(other))
    part = other[i : i + rng.randint(1, 512)]
    k = rng.randrange(len(data) + 1)
    return data[:k] + part + data[k:] if rng.random() < 0.5 else part


def zero_range(rng, data, corpus):
    """A run of zero bytes over the data (a sparse or half-written file)."""
    if not data:
        return data
    i = rng.randrange(len(data))
    j = min(len(data), i + rng.choice((1, 2, 4, 8, 16, 64, 512, 4096)))
    return data[:i] + bytes(j - i) + data[j:]


def mutate_file_bytes(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    """Byte-level damage that keeps offsets in place, for formats addressed by file offset
    (HDF5): bit flips, overwritten and zeroed bytes, truncation; one to three of them."""
    ops = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        op = rng.choice(_FILE_OPS)
        data = op(rng, data, [])
        ops.append(op.__name__)
    return data, "+".join(ops)


_BYTE_OPS = [
    truncate, flip_bits, set_bytes, insert_random, delete_range, duplicate_range,
    huge_length_field, huge_varint_field, splice_other,
]  # fmt: skip
_FILE_OPS = [flip_bits, flip_bits, set_bytes, zero_range, truncate]


# -- running cases ----------------------------------------------------------------------------
class CaseTimeout(BaseException):
    """Raised by the alarm: a case ran past CASE_SECONDS."""


@contextlib.contextmanager
def bounded() -> Iterator[None]:
    """Wall-clock alarm and an address-space cap around a case (POSIX; no-ops elsewhere)."""
    old_handler = None
    if hasattr(signal, "SIGALRM"):

        def on_alarm(signum, frame):
            raise CaseTimeout(f"case ran past {CASE_SECONDS} s")

        old_handler = signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(CASE_SECONDS)
    try:
        yield
    finally:
        if old_handler is not None:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old_handler)


@contextlib.contextmanager
def memory_cap(headroom: int = MEMORY_HEADROOM) -> Iterator[None]:
    """Cap the process's address space at its current size + ``headroom`` for a run."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    if not sys.platform.startswith("linux"):
        yield
        return
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = vm + headroom
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@dataclass
class Tally:
    """Outcomes of one format's run."""

    fmt: str
    ok: int = 0
    refused: int = 0
    bad: list[str] = field(default_factory=list)
    by_error: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        return (
            f"{self.fmt}: {self.ok + self.refused + len(self.bad)} cases, {self.ok} loaded, "
            f"{self.refused} refused with a TorchCaffeError, {len(self.bad)} bad"
        )


class Mismatch(AssertionError):
    """A successful load that differs from the reference decoder."""


def run_case(
    tally: Tally,
    index: int,
    how: str,
    load: Callable[[], object],
    check: Callable[[object], None],
    reference_loads: Callable[[], bool] | None = None,
    names: str | None = None,
    after_refusal: Callable[[], None] | None = None,
) -> None:
    """One case: ``load`` must return (then ``check`` its result) or raise a TorchCaffeError;
    a refusal where ``reference_loads()`` says the reference reads the bytes fine is bad too,
    and so is one whose message does not contain ``names`` (the file's path) when given, or
    after which ``after_refusal()`` raises (e.g. a param changed: loads are all or nothing)."""
    try:
        with bounded():
            result = load()
            check(result)
    except TorchCaffeError as err:
        if names is not None and names not in str(err):
            tally.bad.append(f"{tally.fmt} case {index} ({how}): refusal without the file: {err}")
            return
        if after_refusal is not None:
            try:
                after_refusal()
            except Exception as bad:  # noqa: BLE001
                tally.bad.append(f"{tally.fmt} case {index} ({how}): after refusal: {bad}")
                return
        if reference_loads is not None and reference_loads():
            tally.bad.append(
                f"{tally.fmt} case {index} ({how}): refused what the reference loads: {err}"[:400]
            )
            return
        tally.refused += 1
        name = type(err).__name__
        tally.by_error[name] = tally.by_error.get(name, 0) + 1
        return
    except (Exception, CaseTimeout) as err:  # noqa: BLE001 - every other outcome is the finding
        kind = "mismatch" if isinstance(err, Mismatch) else type(err).__name__
        tally.bad.append(f"{tally.fmt} case {index} ({how}): {kind}: {str(err)[:300]}")
        return
    tally.ok += 1


def report(tally: Tally) -> None:
    print(tally.summary(), dict(sorted(tally.by_error.items())))
    assert not tally.bad, (
        f"{len(tally.bad)} bad outcomes; reproduce with tests.fuzz.engine.rng_for("
        f"{tally.fmt!r}, case):\n" + "\n".join(tally.bad[:20])
    )
