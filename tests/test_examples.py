"""The README's main-job command keeps working (a short run of examples/digits/digits.py)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits" / "digits.py"


def test_digits_builds_lmdbs_trains_finetunes_saves_and_reloads(tmp_path, capsys):
    pytest.importorskip("sklearn", reason="the example's extra: pip install -e '.[examples]'")
    spec = importlib.util.spec_from_file_location("digits_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = ["--iters", "20", "--finetune-iters", "5", "--work", str(tmp_path)]
    assert module.main(argv) == 0
    for db in ("digits_train_lmdb", "digits_test_lmdb"):
        assert (tmp_path / db / "data.mdb").is_file()
    assert (tmp_path / "digits_mean.binaryproto").is_file()
    std = capsys.readouterr()
    out = std.out
    assert "Processed 1437 files." in std.err  # convert_imageset's glog line
    tuned = re.search(r"AdamW fine-tuning: .* test accuracy (\S+)", out).group(1)
    reloaded = re.search(r"fresh caffe\.Net: test accuracy (\S+)", out).group(1)
    assert tuned == reloaded
