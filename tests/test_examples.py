"""The README's main-job command keeps working (a short run of examples/quickstart.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "quickstart.py"


def test_quickstart_trains_saves_and_reloads(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("quickstart", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--iters", "3", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "lenet_quickstart.caffemodel").stat().st_size > 1_000_000
    out = capsys.readouterr().out
    assert "max |prob - torch module prob| = 0.00e+00" in out
