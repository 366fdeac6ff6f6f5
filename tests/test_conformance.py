"""Every golden case computed by the reference Caffe, run through the Caffe face.

Known gaps live in ONE place, ``golden_xfail.toml`` (case pattern -> reason); they are strict
xfails, so a case that starts passing must leave the list. Counts per group are printed at
the end of the run (see conftest's terminal summary).
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest
import tomllib

from .helpers.golden import RUNNERS, discover

ROOT = Path(__file__).resolve().parent
CASES = discover(ROOT / "golden")
XFAIL = tomllib.loads((ROOT / "golden_xfail.toml").read_text())["xfail"]


def xfail_reason(case_id: str) -> str | None:
    for pattern, reason in XFAIL.items():
        if fnmatch.fnmatchcase(case_id, pattern):
            return reason
    return None


def _params():
    for case in CASES:
        reason = xfail_reason(case.id)
        marks = [pytest.mark.conformance]
        if reason:
            marks.append(pytest.mark.xfail(reason=reason, strict=True))
        yield pytest.param(case, id=case.id, marks=marks)


def test_golden_tree_is_complete():
    assert len(CASES) >= 198, "tests/golden is missing cases: re-vendor ../shared/golden"
    unknown = [p for p in XFAIL if not any(fnmatch.fnmatchcase(c.id, p) for c in CASES)]
    assert not unknown, f"golden_xfail.toml names no existing case: {unknown}"


@pytest.mark.parametrize("case", list(_params()))
def test_golden_case(case):
    runner = RUNNERS.get(case.group)
    if runner is None:
        pytest.fail(f"no runner for golden group {case.group!r}")
    runner(case)


def test_golden_mode_switch(monkeypatch):
    """TORCHCAFFE_GOLDEN_MODE=gpu runs the cases in GPU mode; a typo is an error, not a CPU
    run that looks like a GPU one."""
    import torch

    import torchcaffe

    case = next(c for c in CASES if c.group == "layers")
    monkeypatch.setenv("TORCHCAFFE_GOLDEN_MODE", "gpu")
    if torch.cuda.is_available():
        RUNNERS[case.group](case)
        assert torchcaffe.runtime.mode() == "gpu"
    else:
        with pytest.raises(torchcaffe.errors.DeviceError, match="set_mode_gpu"):
            RUNNERS[case.group](case)
    monkeypatch.setenv("TORCHCAFFE_GOLDEN_MODE", "gpus")
    with pytest.raises(ValueError, match="expected cpu or gpu"):
        RUNNERS[case.group](case)
