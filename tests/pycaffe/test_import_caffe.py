"""``import caffe`` resolving to torchcaffe (the opt-in alias and the shim), in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SHIM = Path(__file__).resolve().parents[2] / "shim"

SCRIPT = """
import caffe
import caffe.io, caffe.draw, caffe.net_spec, caffe.coord_map, caffe.classifier, caffe.detector
from caffe import layers as L, params as P
from caffe.proto import caffe_pb2
import torchcaffe
assert caffe is torchcaffe
assert caffe.io is torchcaffe.io and caffe.io.Transformer is torchcaffe.io.Transformer
assert caffe_pb2 is torchcaffe.proto.caffe_pb2
assert caffe.Classifier is caffe.classifier.Classifier and caffe.Detector is caffe.detector.Detector
assert L.Convolution and P.Pooling.MAX == caffe_pb2.PoolingParameter.MAX
assert callable(caffe.coord_map.coord_map_from_to)
import sys
import caffe.proto.caffe_pb2
assert sys.modules["caffe.proto.caffe_pb2"] is caffe_pb2
import caffe._caffe
from caffe._caffe import Timer, NCCL, init_log, log, has_nccl, solver_count, __version__
assert caffe._caffe is torchcaffe._caffe and Timer is caffe.Timer and NCCL is caffe.NCCL
assert __version__ == caffe.__version__ and not has_nccl() and solver_count() == 1
for name in ("Net", "Layer", "SGDSolver", "AdamSolver", "get_solver", "layer_type_list",
             "set_mode_cpu", "set_device", "set_random_seed", "set_solver_rank", "Blob"):
    assert getattr(caffe._caffe, name) is getattr(caffe, name), name
assert issubclass(caffe.SGDSolver, caffe._caffe.Solver)
print("ok")
"""


def _run(code: str, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )


def test_shim_package_makes_import_caffe_torchcaffe():
    done = _run(SCRIPT, pythonpath=str(SHIM))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_install_caffe_alias_without_the_shim():
    done = _run("import torchcaffe; torchcaffe.install_caffe_alias()\n" + SCRIPT)
    assert done.returncode == 0, done.stderr


def test_unknown_submodule_is_an_import_error():
    done = _run(
        "import torchcaffe; torchcaffe.install_caffe_alias()\n"
        "try:\n    import caffe.no_such_module\nexcept ImportError:\n    print('ok')\n"
    )
    assert done.stdout.strip() == "ok", done.stderr
