"""Shared fixtures: golden data root, the shared models folder, devices, seeding."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden"
SHARED = (REPO / ".." / "shared").resolve()
MODELS = SHARED / "models"

if (
    os.environ.get("PYTEST_XDIST_WORKER")
    and os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") != "1"
):
    # Several workers, each with as many torch threads as there are cores, oversubscribe
    # the machine; OpenMP's spinning threads then wait on descheduled ones, and the small
    # ops of these tests ran up to 8x slower (tests/net/test_passes_random.py: 65 s -> 8 s).
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def golden_root() -> Path:
    return GOLDEN


@pytest.fixture(scope="session")
def models_root() -> Path:
    if not MODELS.is_dir():
        pytest.skip(
            f"../shared/models is absent (looked in {MODELS}); the real-model tests "
            "need the shared folder beside the checkout"
        )
    return MODELS


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    return torch.device(request.param)


@pytest.fixture(autouse=True)
def _seed_and_mode():
    import torchcaffe

    torch.manual_seed(1701)
    torchcaffe.set_mode_cpu()
    yield
    torchcaffe.set_mode_cpu()


def pytest_collection_modifyitems(config, items):
    if os.environ.get("TORCHCAFFE_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow test: set TORCHCAFFE_SLOW=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    config.addinivalue_line("markers", "conformance: a golden reference case")


def pytest_terminal_summary(terminalreporter):
    """Print conformance counts per golden group (passed / xfailed / failed)."""
    counts: dict[str, dict[str, int]] = {}
    for outcome in ("passed", "failed", "xfailed", "xpassed", "skipped"):
        for rep in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(rep, "nodeid", "")
            if "test_golden_case[" not in nodeid or rep.when not in ("call", "setup"):
                continue
            if rep.when == "setup" and outcome == "passed":
                continue
            group = nodeid.split("[", 1)[1].split("/", 1)[0]
            counts.setdefault(group, {}).setdefault(outcome, 0)
            counts[group][outcome] += 1
    if not counts:
        return
    terminalreporter.section("golden conformance")
    for group in sorted(counts):
        row = ", ".join(f"{k} {v}" for k, v in sorted(counts[group].items()))
        terminalreporter.write_line(f"{group:8s} {row}")


@pytest.fixture
def meta_gpu_mode(monkeypatch):
    """The Caffe face computing on meta, as in GPU mode on CUDA; host reads of meta values
    answer zeros. (Device discipline without a GPU: any host tensor mixed into the
    computation fails there, as it would on CUDA.)"""
    from torchcaffe import runtime, syncedmem

    meta = torch.device("meta")
    monkeypatch.setattr(runtime, "compute_device", lambda: meta)
    monkeypatch.setattr(syncedmem, "default_gpu_device", lambda: meta)
    to_float, item, equal, copy = (
        torch.Tensor.__float__,
        torch.Tensor.item,
        torch.equal,
        torch.Tensor.copy_,
    )
    monkeypatch.setattr(torch.Tensor, "__float__", lambda t: 0.0 if t.is_meta else to_float(t))
    monkeypatch.setattr(torch.Tensor, "item", lambda t: 0.0 if t.is_meta else item(t))
    monkeypatch.setattr(torch, "equal", lambda a, b: (a.is_meta or b.is_meta) or equal(a, b))

    def copy_(dst, src, non_blocking=False):
        if isinstance(src, torch.Tensor) and src.is_meta and not dst.is_meta:
            return dst  # meta holds no values to copy to the host
        return copy(dst, src, non_blocking)

    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
