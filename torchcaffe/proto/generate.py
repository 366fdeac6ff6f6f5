"""Regenerate ``caffe_pb2.py`` / ``caffe_pb2.pyi`` from ``proto/caffe.proto``.

The schema is written by hand in ``proto/caffe.proto``; the Python bindings are generated from it
with the protoc bundled in ``grpcio-tools``, so no system protoc is needed and the output is
reproducible. Run ``python -m torchcaffe.proto.generate [--out DIR]`` after editing the schema
(a test checks that regenerating gives no diff).
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = REPO_ROOT / "proto"
PROTO_FILE = PROTO_DIR / "caffe.proto"
DEFAULT_OUT = Path(__file__).resolve().parent
# The module the message classes name as theirs: protoc names it after the .proto file
# ("caffe_pb2"), which pickle cannot import, so a pickled net (``torch.save(net)``) failed.
MODULE = "torchcaffe.proto.caffe_pb2"


def generate(out_dir: Path = DEFAULT_OUT) -> None:
    """Compile ``proto/caffe.proto`` into ``out_dir`` (``caffe_pb2.py`` and ``caffe_pb2.pyi``)."""
    from grpc_tools import protoc

    out_dir.mkdir(parents=True, exist_ok=True)
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_DIR}",
        f"--proto_path={well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        str(PROTO_FILE),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO_FILE}")
    generated = out_dir / "caffe_pb2.py"
    code = generated.read_text()
    top = "BuildTopDescriptorsAndMessages(DESCRIPTOR, 'caffe_pb2', _globals)"
    if top not in code:
        raise RuntimeError(f"{generated}: protoc's output changed; cannot name the module")
    generated.write_text(code.replace(top, top.replace("'caffe_pb2'", f"'{MODULE}'")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    generate(parser.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
