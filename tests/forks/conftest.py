"""Helpers for fork-schema tests: a fork's caffe.proto made from ours by text edits, and the
fork's own generated module, run in a subprocess (it defines ``caffe.*`` messages too, so it
cannot share a process's default descriptor pool with torchcaffe's caffe_pb2)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OUR_PROTO = ROOT / "proto" / "caffe.proto"
EXAMPLE_DIR = ROOT / "examples" / "forks"


def make_fork_proto(folder: Path, edits: list[tuple[str, str]], name: str = "caffe.proto") -> Path:
    """Our caffe.proto with each (old, new) text replaced once; every old must be present."""
    text = OUR_PROTO.read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    path = folder / name
    path.write_text(text)
    return path


def run_with_fork_module(proto: Path, script: str, cwd: Path) -> str:
    """Compile ``proto`` with protoc into a Python module and run ``script`` importing it as
    ``fork_pb2`` in a fresh interpreter; returns its stdout."""
    from grpc_tools import protoc

    out = cwd / "gen"
    out.mkdir(exist_ok=True)
    rc = protoc.main(["protoc", f"-I{proto.parent}", f"--python_out={out}", proto.name])
    assert rc == 0
    module = proto.stem + "_pb2"
    code = f"import sys; sys.path.insert(0, {str(out)!r})\nimport {module} as fork_pb2\n"
    code += textwrap.dedent(script)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(autouse=True)
def _needs_protoc():
    pytest.importorskip("grpc_tools", reason="the forks extra: pip install -e '.[forks]'")
