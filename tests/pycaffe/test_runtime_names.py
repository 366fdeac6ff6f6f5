"""pycaffe's process-level names (python/caffe/_caffe.cpp at HEAD): logging, Timer, the
multi-GPU solver count/rank, and NCCL, which a single-process torch build refuses."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

import torchcaffe as caffe
from torchcaffe.errors import TorchCaffeError, UnsupportedError, UsageError

# every name python/caffe/__init__.py at HEAD exports
PYCAFFE_NAMES = (
    "Net SGDSolver NesterovSolver AdaGradSolver RMSPropSolver AdaDeltaSolver AdamSolver NCCL "
    "Timer init_log log set_mode_cpu set_mode_gpu set_device Layer get_solver layer_type_list "
    "set_random_seed solver_count set_solver_count solver_rank set_solver_rank set_multiprocess "
    "has_nccl __version__ TRAIN TEST Classifier Detector io layers params NetSpec to_proto"
).split()


@pytest.fixture
def solver_state():
    yield
    caffe.set_solver_count(1)
    caffe.set_solver_rank(0)
    caffe.set_multiprocess(False)


def test_every_pycaffe_module_name_exists():
    assert [n for n in PYCAFFE_NAMES if not hasattr(caffe, n)] == []
    assert set(PYCAFFE_NAMES) - {"__version__"} <= set(caffe.__all__)


def test_caffe_pycaffe_has_what_pycaffe_py_imports_from_caffe():
    """python/caffe/pycaffe.py imports Net, the six solvers, NCCL and Timer from _caffe."""
    import torchcaffe.pycaffe as pycaffe

    names = ["Net", "SGDSolver", "NesterovSolver", "AdaGradSolver", "RMSPropSolver"]
    names += ["AdaDeltaSolver", "AdamSolver", "NCCL", "Timer"]
    assert [n for n in names if not hasattr(pycaffe, n)] == []
    assert pycaffe.Timer is caffe.Timer and pycaffe.NCCL is caffe.NCCL


def test_solver_count_and_rank_default_and_set(solver_state):
    from torchcaffe import runtime

    assert (caffe.solver_count(), caffe.solver_rank(), runtime.multiprocess()) == (1, 0, False)
    caffe.set_solver_count(4)
    caffe.set_solver_rank(2)
    caffe.set_multiprocess(True)
    assert (caffe.solver_count(), caffe.solver_rank(), runtime.multiprocess()) == (4, 2, True)
    with pytest.raises(UsageError, match="set_solver_count"):
        caffe.set_solver_count("4")
    with pytest.raises(UsageError, match="set_solver_rank"):
        caffe.set_solver_rank(1.5)


def test_nccl_is_refused_clearly():
    assert caffe.has_nccl() is False
    with pytest.raises(UnsupportedError, match="NCCL is not supported") as err:
        caffe.NCCL(None, b"uid")
    assert isinstance(err.value, TorchCaffeError)
    with pytest.raises(UnsupportedError, match="NCCL"):
        caffe.NCCL.new_uid()  # python/train.py's first NCCL call


def test_timer_start_stop_ms(caplog):
    timer = caffe.Timer()
    with caplog.at_level(logging.WARNING, logger="torchcaffe"):
        assert timer.ms == 0.0  # Caffe: a warning and 0 before the first start
    assert "never been run" in caplog.text
    timer.start()
    time.sleep(0.03)
    timer.stop()
    elapsed = timer.ms
    assert 29.0 <= elapsed < 60_000.0
    time.sleep(0.01)
    assert timer.ms == elapsed  # stopped: the reading stays
    timer.start()
    time.sleep(0.01)
    running = timer.ms  # read while running: stops it first
    assert running >= 9.0
    time.sleep(0.01)
    assert timer.ms == running


def test_log_is_info_on_the_torchcaffe_logger(caplog):
    with caplog.at_level(logging.INFO, logger="torchcaffe"):
        caffe.log("Using devices [0]")
    assert [(r.name, r.levelno, r.message) for r in caplog.records] == [
        ("torchcaffe", logging.INFO, "Using devices [0]")
    ]


def test_init_log_levels_in_a_fresh_process():
    code = (
        "import logging, torchcaffe as caffe\n"
        "caffe.init_log()\n"
        "caffe.log('shown-info')\n"
        "caffe.init_log(1)\n"
        "caffe.log('hidden-info')\n"
        "logging.getLogger('torchcaffe.solver').warning('shown-warning')\n"
        "caffe.init_log(0, False)\n"
        "caffe.log('hidden-to-files')\n"
        "logging.getLogger('torchcaffe').error('shown-error')\n"
        "try:\n    caffe.init_log('INFO')\nexcept TypeError:\n    print('usage-error')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == [
        "shown-info",
        "shown-warning",
        "shown-error",
    ]
    assert lines[0].startswith("I") and lines[1].startswith("W") and lines[2].startswith("E")
    assert done.stdout.strip() == "usage-error"
