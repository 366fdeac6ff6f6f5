"""``torchcaffe train``: Caffe's train action (finetune, resume, flag conflicts)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import torchcaffe as caffe
from torchcaffe.cli.__main__ import main
from torchcaffe.cli.train import rank_gpu
from torchcaffe.errors import DeviceError
from torchcaffe.solver import distributed

CASE = Path(__file__).resolve().parents[1] / "golden" / "solvers" / "sgd_momentum_step"


@pytest.fixture
def case(tmp_path, monkeypatch):
    work = tmp_path / "case"
    shutil.copytree(CASE, work)
    monkeypatch.chdir(work)
    text = (work / "solver.prototxt").read_text()
    text = text.replace("snapshot: 0", "snapshot: 10").replace(
        "snapshot_after_train: false", "snapshot_after_train: true"
    )
    (work / "solver.prototxt").write_text(text)
    return work


def test_train_finetunes_from_weights_like_the_golden_run(case, capsys):
    assert (
        main(["train", "--solver", "solver.prototxt", "--weights", "weights.caffemodel", "--quiet"])
        == 0
    )
    assert "to iteration 15" in capsys.readouterr().out
    assert (case / "final_iter_10.solverstate").exists()
    net = caffe.Net("train.prototxt", "final_iter_15.caffemodel", caffe.TRAIN)
    with np.load(case / "arrays.npz") as golden:
        np.testing.assert_allclose(
            net.params["ip1"][0].data, golden["param/ip1/0"], rtol=1e-4, atol=1e-5
        )


def test_train_resumes_from_a_snapshot(case, capsys):
    assert (
        main(["train", "--solver", "solver.prototxt", "--weights", "weights.caffemodel", "--quiet"])
        == 0
    )
    (case / "final_iter_15.caffemodel").unlink()
    assert (
        main(
            [
                "train",
                "--solver",
                "solver.prototxt",
                "--snapshot",
                "final_iter_10.solverstate",
                "--quiet",
            ]
        )
        == 0
    )
    assert (case / "final_iter_15.caffemodel").exists()


def test_a_resumed_run_logs_the_restore_as_caffes_tool(case, capsys):
    """caffe.cpp restores the state itself ("Resuming from ...") before "Starting
    Optimization" and calls Solve() without a file: no "Restoring previous solver status"."""
    assert main(["train", "-solver", "solver.prototxt", "-weights", "weights.caffemodel"]) == 0
    capsys.readouterr()
    assert (
        main(["train", "-solver", "solver.prototxt", "-snapshot", "final_iter_10.solverstate"]) == 0
    )
    lines = [line.split("] ", 1)[1] for line in capsys.readouterr().err.splitlines()]
    start = lines.index("Starting Optimization")
    assert lines[start - 1] == "Resuming from final_iter_10.solverstate"
    assert lines[start + 1 : start + 3] == ["Solving tiny", "Learning Rate Policy: step"]
    assert not any(line.startswith("Restoring previous solver status") for line in lines)


def test_weights_and_snapshot_together_is_one_line_error(case, capsys):
    assert main(["train", "--solver", "solver.prototxt", "--weights", "w", "--snapshot", "s"]) == 2
    err = capsys.readouterr().err
    assert "torchcaffe train: error: solver.prototxt:" in err and "not both" in err


def test_gpu_solver_mode_without_cuda_falls_back_to_cpu(case, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    text = (case / "solver.prototxt").read_text().replace("solver_mode: CPU", "solver_mode: GPU")
    (case / "solver.prototxt").write_text(text)
    assert main(["train", "--solver", "solver.prototxt", "--quiet"]) == 0


def test_solver_mode_unset_trains_on_the_cpu_as_caffe(monkeypatch):
    """caffe.cpp takes the GPU only for a solver_mode written in the file; the field's
    default (GPU) gave device 0 on a CUDA machine and a spurious warning on others."""
    import torch

    from torchcaffe.cli.train import _gpus
    from torchcaffe.proto import caffe_pb2

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _gpus(caffe_pb2.SolverParameter(), "") == []
    assert _gpus(caffe_pb2.SolverParameter(solver_mode="GPU", device_id=2), "") == [2]


@pytest.mark.parametrize(
    "gpus, local_rank, per_host, want",
    [([], 1, "2", None), ([3, 5], 1, "2", 5), ([2], 0, "1", 2), ([0, 1, 2], 2, "3", 2)],
)
def test_each_local_rank_takes_its_own_gpu(gpus, local_rank, per_host, want, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", per_host)
    group = distributed.ProcessGroup(local_rank, int(per_host), local_rank)
    assert rank_gpu(gpus, group) == want


def test_more_ranks_than_gpus_on_a_host_is_refused_before_nccl(monkeypatch):
    # two ranks on one GPU failed deep in NCCL ("Duplicate GPU detected") on a 1-GPU machine
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(DeviceError, match="2 training processes on this host but 1 GPU"):
        rank_gpu([0], distributed.ProcessGroup(1, 2, 1))


def test_the_training_log_has_glogs_prefix_for_caffes_log_parsers(case, capsys):
    """tools/extra/parse_log.py reads each line's time from glog's prefix
    (``I0210 13:39:22.381027 25210 solver.cpp:204] ...``, extract_seconds.py) and the
    iterations and outputs from the text after it."""
    import re

    text = (case / "solver.prototxt").read_text().replace("display: 0", "display: 5")
    (case / "solver.prototxt").write_text(text)
    assert main(["train", "--solver", "solver.prototxt", "--weights", "weights.caffemodel"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "] " in line]
    glog = re.compile(r"^[IWEC](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) +\d+ [\w.]+:\d+\] ")
    assert lines and all(glog.match(line) for line in lines), lines[:3]
    month, day = (int(v) for v in glog.match(lines[0]).groups()[:2])
    assert 1 <= month <= 12 and 1 <= day <= 31
    assert any(re.search(r"\] Iteration 5, lr = ", line) for line in lines)
    assert any("Solving" in line for line in lines)  # parse_log's start time


def test_several_weights_files_warn_once_for_what_none_of_them_fills(case, capsys):
    """-weights a,b: each file fills what it holds; one warning, one line, at the end, for
    the layers no file filled (not, per file, for those the next file fills)."""
    net = caffe.Net("train.prototxt", "weights.caffemodel", caffe.TRAIN)
    caffe_pb2 = caffe.proto.caffe_pb2
    for layer, name in (("ip1", "a.caffemodel"), ("ip2", "b.caffemodel")):
        whole = caffe_pb2.NetParameter()
        net.save(str(case / "whole.caffemodel"))
        whole.ParseFromString((case / "whole.caffemodel").read_bytes())
        keep = caffe_pb2.NetParameter(name=whole.name)
        keep.layer.extend(lp for lp in whole.layer if lp.name == layer)
        (case / name).write_bytes(keep.SerializeToString())
    argv = ["train", "-solver", "solver.prototxt", "--quiet", "-weights"]
    assert main([*argv, "a.caffemodel,b.caffemodel"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main([*argv, "a.caffemodel,a.caffemodel"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(err) == 1 and err[0].startswith("torchcaffe train: warning: 1 layers")
    assert "'ip2'" in err[0] and "'ip1'" not in err[0]


def test_a_solver_without_weights_warns_of_nothing(case):
    """No -weights and no solver 'weights': nothing was asked to be filled."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", caffe.errors.PartialWeightsWarning)
        caffe.SGDSolver("solver.prototxt")


def test_the_log_ends_with_caffe_tools_own_optimization_done(case, capsys, monkeypatch):
    """caffe.cpp logs "Optimization Done." after Solver::Solve returns: a finished run has
    the solver's line and the tool's, a stopped run "Optimization stopped early." and then
    the tool's (scripts watching the log wait for it)."""
    import signal

    from torchcaffe.solver.solver import Solver

    def tail() -> list[str]:
        err = capsys.readouterr().err.splitlines()
        return [line.split("] ", 1)[1] for line in err if "] Optimization" in line]

    assert main(["train", "-solver", "solver.prototxt", "-weights", "weights.caffemodel"]) == 0
    assert tail() == ["Optimization Done.", "Optimization Done."]
    update = Solver.apply_update

    def interrupted(self: Solver) -> None:
        update(self)
        if self.iter == 2:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(Solver, "apply_update", interrupted)
    assert main(["train", "-solver", "solver.prototxt", "-weights", "weights.caffemodel"]) == 0
    assert tail() == ["Optimization stopped early.", "Optimization Done."]


def test_a_signal_while_the_nets_load_is_read_by_the_first_iteration(case, capsys, monkeypatch):
    """caffe.cpp builds its SignalHandler before the solver: Ctrl-C (or a closed terminal's
    SIGHUP) while the nets load is a flag, so training stops after iteration 1 and writes
    its final snapshot; it is not an interrupt that loses the run."""
    import signal

    from torchcaffe.solver import solver as solver_module

    build = solver_module.build_train_net

    def interrupted_build(*args, **kwargs):
        signal.raise_signal(signal.SIGINT)
        return build(*args, **kwargs)

    monkeypatch.setattr(solver_module, "build_train_net", interrupted_build)
    assert main(["train", "-solver", "solver.prototxt", "-weights", "weights.caffemodel"]) == 0
    assert "to iteration 1," in capsys.readouterr().out
    assert (case / "final_iter_1.solverstate").exists()


def test_the_display_line_prints_the_lapse_as_caffe_streams_a_float(case, capsys, monkeypatch):
    """Solver::Step logs ``Iteration N (R iter/s, Ls/D iters), loss = X`` with L and R
    streamed as floats: 6 significant digits, no padding zeros (0.25s, not 0.250s)."""
    import itertools
    import re
    import types

    from torchcaffe.solver import solver as solver_module

    clock = itertools.count(0.0, 0.25)
    monkeypatch.setattr(
        solver_module, "time", types.SimpleNamespace(perf_counter=lambda: next(clock))
    )
    text = (case / "solver.prototxt").read_text().replace("display: 0", "display: 5")
    (case / "solver.prototxt").write_text(text)
    assert main(["train", "-solver", "solver.prototxt", "-weights", "weights.caffemodel"]) == 0
    line = re.compile(r"\] Iteration (\d+) \((\S+) iter/s, (\S+)s/5 iters\), loss = \S+$")
    found = [m.groups() for m in map(line.search, capsys.readouterr().err.splitlines()) if m]
    assert [int(it) for it, _, _ in found] == [0, 5, 10]
    for _, rate, lapse in found:
        assert lapse == f"{float(lapse):g}" and rate == f"{float(rate):g}"
        assert float(lapse) > 0


def test_what_building_the_solver_logs_is_in_the_training_log(case, capsys):
    """caffe.cpp logs "Use CPU." and then builds the solver, whose LoadNetWeights logs
    "Finetuning from F": both before "Starting Optimization", in the same log."""
    assert main(["train", "-solver", "solver.prototxt", "-weights", "weights.caffemodel"]) == 0
    lines = [
        line.split("] ", 1)[1] for line in capsys.readouterr().err.splitlines() if "] " in line
    ]
    assert lines[:3] == ["Use CPU.", "Finetuning from weights.caffemodel", "Starting Optimization"]


def test_a_spawned_rank_reports_its_error_in_one_line(case, capfd, monkeypatch):
    """``-gpu 0,1`` starts one process per GPU; a rank's TorchCaffeError ends the run with
    the CLI's one-line error and status 2, not torch.multiprocessing's traceback."""
    from torchcaffe.cli import train

    monkeypatch.setattr(train, "_gpus", lambda param, flag: [0, 1])  # this process only
    (case / "solver.prototxt").write_text(
        (case / "solver.prototxt").read_text().replace("train.prototxt", "missing.prototxt")
    )
    assert main(["train", "--solver", "solver.prototxt", "-gpu", "0,1"]) == 2
    err = capfd.readouterr().err
    assert "torchcaffe train: error: rank " in err
    assert "Traceback" not in err
