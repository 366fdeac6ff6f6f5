"""examples/forks/run_fork.py runs end to end (in its own interpreter: it registers a layer)."""

from __future__ import annotations

import subprocess
import sys

from .conftest import EXAMPLE_DIR

SCRIPT = EXAMPLE_DIR / "run_fork.py"


def test_fork_example_runs_trains_saves_and_reloads(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--work", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "reads the fork's ChannelGateParameter: gate_bias 0.25" in out
    assert "a fresh net reloaded from it gives the same loss: True" in out
    moved = float(out.split("moved the gates by ")[1].split()[0])
    assert moved > 0  # the solver step reached the custom layer's blob
    assert (tmp_path / "gated.caffemodel").is_file()
