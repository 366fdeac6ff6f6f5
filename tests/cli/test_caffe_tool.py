"""The caffe tool's command line: gflags spellings, train/test/time/device_query, signal
effects, and errors as one line."""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import torchcaffe as caffe
from torchcaffe.cli.__main__ import build_parser, main, split_action
from torchcaffe.cli.flags import gflags_argv, gpu_ids
from torchcaffe.cli.train import _signal_actions
from torchcaffe.errors import DeviceError
from torchcaffe.formats.prototxt import read_net
from torchcaffe.glog import GlogFormatter

GLOG_LINE = re.compile(r"I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ \S+:\d+\] ")
CASE = Path(__file__).resolve().parents[1] / "golden" / "solvers" / "sgd_momentum_step"


@pytest.fixture
def case(tmp_path, monkeypatch):
    work = tmp_path / "case"
    shutil.copytree(CASE, work)
    monkeypatch.chdir(work)
    return work


def train_parser() -> argparse.ArgumentParser:
    return build_parser()[1]["train"]


@pytest.mark.parametrize(
    "argv",
    [
        ["-solver", "s", "-weights", "w", "-sigint_effect", "none"],
        ["--solver", "s", "--weights", "w", "--sigint_effect", "none"],
        ["-solver=s", "-weights=w", "-sigint_effect=none"],
        ["--solver=s", "--weights=w", "--sigint-effect=none"],
    ],
)
def test_every_gflags_spelling_parses_alike(argv):
    p = train_parser()
    args = p.parse_args(gflags_argv(p, argv))
    assert (args.solver, args.weights, args.sigint_effect) == ("s", "w", "none")


def test_gflags_leaves_values_and_unknown_flags_alone():
    p = train_parser()
    assert gflags_argv(p, ["-gpu", "-1", "-stage=a,b", "-solverx", "x", "-h"]) == [
        "--gpu",
        "-1",
        "--stage=a,b",
        "-solverx",
        "x",
        "-h",
    ]


def test_gflags_booleans_glog_flags_and_other_actions_flags():
    """gflags' -noflag and yes/no/t/f values; glog's flags taken and dropped; the caffe tool's
    global flags taken by each action (``caffe time -weights w`` ignores -weights)."""
    image = build_parser()[1]["convert_imageset"]
    for spelling in (["-nogray"], ["-gray=no"], ["-gray=False"], ["--gray=F"]):
        assert image.parse_args(gflags_argv(image, [*spelling, "r/", "l", "d"])).gray is False
    for spelling in (["-gray"], ["-gray=yes"], ["-gray=T"]):
        assert image.parse_args(gflags_argv(image, [*spelling, "r/", "l", "d"])).gray is True
    p = train_parser()
    argv = ["-log_dir", "/tmp", "-logtostderr", "-minloglevel=1", "-v", "2", "-solver", "s"]
    dropped: list[str] = []
    assert gflags_argv(p, argv, dropped_glog=dropped) == ["--solver", "s"]
    assert dropped == ["log_dir", "logtostderr", "minloglevel", "v"]  # the CLI notes each
    time = build_parser()[1]["time"]
    argv = ["-model", "m", "-weights", "w", "-phase=TEST", "-snapshot", "x"]
    kept = gflags_argv(time, argv, frozenset({"weights", "snapshot"}))
    assert kept == ["--model", "m", "--phase=TEST"]


@pytest.mark.parametrize(
    "argv,quiet,python_layers",
    [
        (["-quiet=true", "-allow_python_layers=yes"], True, True),
        (["--quiet=F", "-noallow_python_layers"], False, False),
        (["-quiet", "-allow_python_layers", "-noquiet", "--allow-python-layers=0"], False, False),
        (["-quiet=no", "-quiet"], True, False),
    ],
)
def test_our_own_switches_take_gflags_boolean_spellings(argv, quiet, python_layers):
    """``-quiet`` and ``-allow_python_layers`` are gflags-style booleans like Caffe's
    (``-flag=true``, ``-noflag``; the last spelling wins), not argparse errors."""
    p = train_parser()
    args = p.parse_args(gflags_argv(p, [*argv, "-solver", "s"]))
    assert (args.quiet, args.allow_python_layers) == (quiet, python_layers)


def test_a_flag_value_before_the_action_is_not_the_action():
    """gflags takes a flag's value before it looks for the command: ``caffe -stage test time``
    times the net (stage "test"); it does not score it."""
    assert split_action(["-stage", "test", "time", "-model", "m"]) == (
        "time",
        ["-stage", "test", "-model", "m"],
    )
    assert split_action(["--gpu", "0", "train", "-stage", "test"]) == (
        "train",
        ["--gpu", "0", "-stage", "test"],
    )
    assert split_action(["-stage=test", "time"]) == ("time", ["-stage=test"])


def test_gpu_ids_follow_caffe():
    assert gpu_ids("", 2) == [] and gpu_ids(None, 2) == [] and gpu_ids("-1", 2) == []
    assert gpu_ids("all", 3) == [0, 1, 2] and gpu_ids("0,2", 3) == [0, 2]
    with pytest.raises(DeviceError):
        gpu_ids("x", 2)


def test_single_dash_train_writes_the_same_caffemodel_as_double_dash(case):
    """The golden finetuning run, with its final snapshot written, under each spelling."""
    text = (case / "solver.prototxt").read_text()
    (case / "solver.prototxt").write_text(
        text.replace("snapshot_after_train: false", "snapshot_after_train: true")
    )
    final = case / "final_iter_15.caffemodel"
    runs = [
        ["-solver", "solver.prototxt", "-weights", "weights.caffemodel"],
        ["--solver", "solver.prototxt", "--weights", "weights.caffemodel"],
        ["-solver=solver.prototxt", "--weights=weights.caffemodel", "-quiet"],
    ]
    written = []
    for argv in runs:
        assert main(["train", *argv]) == 0
        written.append(final.read_bytes())
        final.unlink()
    assert written[0] == written[1] == written[2]
    net = caffe.Net("train.prototxt", caffe.TRAIN)
    (case / "out.caffemodel").write_bytes(written[0])
    net.copy_from("out.caffemodel")
    with np.load(case / "arrays.npz") as golden:  # and it is the golden result
        np.testing.assert_allclose(
            net.params["ip1"][0].data, golden["param/ip1/0"], rtol=1e-4, atol=1e-5
        )


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["train", "-solver", "solver.prototxt", "-bogus", "1"], "unrecognized arguments: -bogus"),
        (["time", "-model", "nope.prototxt", "-weights", "w"], "nope.prototxt"),
        (["train", "-solver", "missing.prototxt"], "missing.prototxt"),
        (["train", "-solver", "solver.prototxt", "-snapshot", "gone.solverstate"], "gone"),
        (["train", "-solver", "solver.prototxt", "-sigint_effect", "x"], "invalid choice"),
        (["train"], "required: --solver"),
        (["test", "-model", "train.prototxt", "-weights", "nope.caffemodel"], "nope.caffemodel"),
        # the flag is blamed, not the solver's weights field caffe.cpp puts it in
        (
            ["train", "-solver", "solver.prototxt", "-weights", "final.caffemodel,nope.caffemodel"],
            "-weights: file 'nope.caffemodel' not found",
        ),
        (["time", "-model", "nope.prototxt"], "nope.prototxt"),
        (["train", "-solver", "solver.prototxt", "-gpu", "0"], "CUDA is not available"),
        (
            ["test", "-model", "train.prototxt", "-weights", "weights.caffemodel", "-gpu", "all"],
            "CUDA",
        ),
        # an empty flag: caffe.cpp's CHECKs, in its words (not a nameless "file not found")
        (["train", "-solver="], "Need a solver definition to train (-solver is empty)"),
        (["test", "-model=", "-weights=w"], "Need a model definition to score (-model"),
        (["test", "-model", "train.prototxt", "-weights", ""], "Need model weights to score"),
        (["time", "--model="], "Need a model definition to time (-model is empty)"),
    ],
)
def test_bad_flags_and_files_are_one_line(case, capsys, monkeypatch, argv, needle):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    assert code == 2
    err = _without_log_lines(capsys.readouterr().err)
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err
    assert err.startswith(f"torchcaffe {argv[0]}: error: ")


def _without_log_lines(err: str) -> str:
    """stderr less the glog lines logged before an error (Caffe logs "Use CPU." first too)."""
    return "".join(line for line in err.splitlines(True) if not GLOG_LINE.match(line))


def test_python_dash_m_runs_the_same_tool(case):
    done = subprocess.run(
        [sys.executable, "-m", "torchcaffe", "train", "-solver", "solver.prototxt", "-nope"],
        capture_output=True,
        text=True,
        cwd=case,
    )
    assert done.returncode == 2
    assert done.stderr == "torchcaffe train: error: unrecognized arguments: -nope\n"


def test_python_dash_m_times_a_net(case):
    """``python -m torchcaffe`` runs an action through to its report and exit status 0."""
    done = subprocess.run(
        [sys.executable, "-m", "torchcaffe", "time", "-model=train.prototxt", "-iterations=1"],
        capture_output=True,
        text=True,
        cwd=case,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # Caffe's tool logs everything to stderr
    assert "       ip1\tforward: " in done.stderr and "Total Time: " in done.stderr


def _logged(capsys) -> list[str]:
    """The tool's lines, as Caffe logs them: on stderr, each after glog's prefix."""
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert all(GLOG_LINE.match(line) for line in lines)
    return [line.split("] ", 1)[1] for line in lines]


def test_test_prints_batches_and_means_as_caffe(case, capsys):
    """Scores checked against numpy: softmax loss of the two-layer net on each 4-row batch."""
    assert main(["test", "-model", "train.prototxt", "-weights", "weights.caffemodel"]) == 0
    lines = _logged(capsys)
    net = caffe.Net("train.prototxt", "weights.caffemodel", caffe.TEST)
    (w1, b1), (w2, b2) = ([b.data for b in net.params[n]] for n in ("ip1", "ip2"))
    with h5py.File("data.h5") as f:
        data, labels = f["data"][()], f["label"][()].astype(int)
    losses = []
    for i in range(50):
        rows = [(4 * i + r) % len(data) for r in range(4)]
        h = np.maximum(data[rows].reshape(4, -1) @ w1.T + b1, 0) @ w2.T + b2
        h = h - h.max(1, keepdims=True)
        logp = h - np.log(np.exp(h).sum(1, keepdims=True))
        losses.append(-logp[np.arange(4), labels[rows]].mean())
    batches = [line for line in lines if line.startswith("Batch ")]
    assert len(batches) == 50
    for i, line in enumerate(batches):
        head, value = line.rsplit(" = ", 1)
        assert head == f"Batch {i}, loss"
        assert float(value) == pytest.approx(losses[i], rel=1e-5)
    mean = float(np.mean(losses))
    loss_line = next(line for line in lines if line.startswith("Loss: "))
    assert float(loss_line.split()[1]) == pytest.approx(mean, rel=1e-5)
    final = lines[-1]
    assert final.startswith("loss = ") and final.endswith(" loss)") and "(* 1 = " in final
    assert float(final.split()[2]) == pytest.approx(mean, rel=1e-5)


def test_time_prints_a_per_layer_table_and_totals(case, capsys):
    assert main(["time", "-model", "train.prototxt", "-iterations", "2"]) == 0
    out = "\n".join(_logged(capsys))
    for layer in ("data", "ip1", "relu1", "ip2", "loss"):
        assert f"{layer:>10}\tforward: " in out and f"{layer:>10}\tbackward: " in out
    for total in ("Average Forward pass: ", "Average Backward pass: ", "Total Time: "):
        assert total in out
    assert "Average Forward-Backward: " in out
    assert out.count("forward-backward time: ") == 2


def test_time_takes_an_empty_phase_as_train(tmp_path, capsys):
    """caffe.cpp's get_phase_from_flags: ``-phase=`` (a wrapper's unset $PHASE) is time's
    default, TRAIN; a phase Caffe does not know is refused."""
    model = tmp_path / "net.prototxt"
    model.write_text(
        'layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }\n'
        'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"\n'
        "        inner_product_param { num_output: 2 } }\n"
        'layer { name: "train_only" type: "Sigmoid" bottom: "y" top: "s"\n'
        "        include { phase: TRAIN } }\n"
    )

    def timed_layers(*flags):
        assert main(["time", "-model", str(model), "-iterations", "1", *flags]) == 0
        return [line.split("\t")[0].strip() for line in _logged(capsys) if "\tforward: " in line]

    assert timed_layers("-phase=") == timed_layers("-phase", "TRAIN") == ["x", "ip", "train_only"]
    assert timed_layers("-phase=TEST") == ["x", "ip"]
    with pytest.raises(SystemExit):
        main(["time", "-model", str(model), "-phase=VAL"])


def test_time_on_the_cpu_reads_times_as_caffes_cpu_timer(case, capsys):
    """Caffe's CPU Timer is boost's microsecond clock: the per-iteration and total lines are
    whole milliseconds (total_milliseconds), the per-layer and pass averages whole
    microseconds over 1000 (three decimals at most over one iteration)."""
    assert main(["time", "-model", "train.prototxt", "-iterations", "1"]) == 0
    lines = _logged(capsys)
    whole = re.compile(r"\d+ ms\.$")
    micro = re.compile(r"\d+(\.\d{1,3})? ms\.$")
    iteration = next(line for line in lines if line.startswith("Iteration: 1 "))
    assert whole.search(iteration.split("time: ")[1]), iteration
    assert whole.fullmatch(next(line for line in lines if line.startswith("Total Time: "))[12:])
    timed = [line for line in lines if "\tforward: " in line or "\tbackward: " in line]
    timed += [line for line in lines if line.startswith(("Average Forward pass", "Average Back"))]
    assert len(timed) == 12
    for line in timed:
        assert micro.fullmatch(line.rsplit(": ", 1)[1]), line


def test_time_prints_a_per_layer_table_for_googlenet(models_root, tmp_path, capsys):
    """Issue 17's case: every GoogLeNet layer gets a forward and a backward row, in Caffe's
    order (deploy net at batch 1, force_backward so that the tool builds it once)."""
    text = (models_root / "bvlc_googlenet" / "deploy.prototxt").read_text()
    model = tmp_path / "googlenet.prototxt"
    text = text.replace("dim: 10 dim: 3 dim: 224", "dim: 1 dim: 3 dim: 224", 1)
    model.write_text("force_backward: true\n" + text)
    assert main(["time", "-model", str(model), "-iterations", "1"]) == 0
    out = _logged(capsys)
    names = [layer.name for layer in read_net(str(model)).layer]
    assert len(names) > 140 and "inception_5b/output" in names
    for kind in ("forward", "backward"):
        rows = [line.split("\t")[0].strip() for line in out if f"\t{kind}: " in line]
        assert [r for r in rows if not r.endswith("_split")] == names  # + Caffe's splits
        assert len(rows) > len(names)
    assert "Average Forward-Backward: " in "\n".join(out) and "Total Time: " in out[-2]


def test_device_query_queries_what_gpu_names(capsys, monkeypatch):
    """caffe.cpp's device_query loops over get_gpus: without -gpu none, which succeeds with
    or without CUDA (a pipeline's sanity step); -gpu on a machine without CUDA is an error.
    Its lines are glog's, on stderr; nothing on stdout."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["device_query"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and err.endswith("] Querying GPUs \n")
    assert main(["device_query", "-gpu", "0"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err
    if torch.cuda.device_count():
        monkeypatch.undo()
        assert main(["device_query", "-gpu", "0"]) == 0
        out, err = capsys.readouterr()
        assert out == "" and "] Device id:                     0" in err


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on this platform")
@pytest.mark.parametrize(
    "sigint,sighup,raised,stops_at,snapshots",
    [
        ("stop", "snapshot", signal.SIGINT, 3, False),
        ("none", "snapshot", signal.SIGINT, 15, False),
        ("stop", "snapshot", signal.SIGHUP, 15, True),
        ("stop", "stop", signal.SIGHUP, 3, False),
    ],
)
def test_signal_effects(case, sigint, sighup, raised, stops_at, snapshots):
    """A signal at iteration 2 takes effect after that iteration (Caffe's SignalHandler)."""
    solver = caffe.get_solver("solver.prototxt")
    solver.add_callback(lambda: solver.iter == 2 and signal.raise_signal(raised))
    with _signal_actions(sigint, sighup) as request:
        solver.action_request = request
        solver.step(15)
    assert solver.iter == stops_at
    assert (case / "final_iter_3.caffemodel").exists() == snapshots


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on this platform")
@pytest.mark.parametrize(
    "sigint,sighup,raised,stops_at,snapshots",
    [
        # Ctrl-C twice in one iteration: one flag, one snapshot (not one per signal)
        ("snapshot", "none", [signal.SIGINT, signal.SIGINT], 15, [3]),
        # both in one iteration: SIGHUP's effect is read first, SIGINT's the next iteration
        ("snapshot", "stop", [signal.SIGINT, signal.SIGHUP], 3, []),
        ("stop", "snapshot", [signal.SIGINT, signal.SIGHUP], 4, [3]),
    ],
)
def test_signals_are_flags_read_sighup_first(case, sigint, sighup, raised, stops_at, snapshots):
    """Caffe's SignalHandler keeps one flag per signal and CheckForSignals reads SIGHUP's
    before SIGINT's, one per call (util/signal_handler.cpp)."""
    solver = caffe.get_solver("solver.prototxt")
    solver.add_callback(lambda: solver.iter == 2 and [signal.raise_signal(s) for s in raised])
    with _signal_actions(sigint, sighup) as request:
        solver.action_request = request
        solver.step(15)
    assert solver.iter == stops_at
    written = sorted(int(p.stem.split("_")[-1]) for p in case.glob("final_iter_*.caffemodel"))
    assert written == snapshots


def test_gflags_flagfile_and_fromenv_give_their_flags(case, capsys, monkeypatch):
    """gflags' --flagfile (comments, blank lines, a program-name line scoping the flags after
    it, a nested flagfile; later flags override earlier ones) and --fromenv/--tryfromenv,
    which every Caffe tool takes."""
    (case / "inner.flags").write_text("-iterations=2\n")
    (case / "test.flags").write_text(
        "# the caffe tool's test\n\n--model=train.prototxt\n--flagfile=inner.flags\n"
        "convert_imageset\n--iterations=7\ncaff*\n-weights=final.caffemodel\n"
    )
    assert main(["test", "--flagfile=test.flags"]) == 0
    assert "] Running for 2 iterations." in capsys.readouterr().err
    assert main(["test", "-flagfile", "test.flags", "-iterations", "3"]) == 0
    assert "] Running for 3 iterations." in capsys.readouterr().err
    monkeypatch.setenv("FLAGS_iterations", "4")
    assert main(["test", "--flagfile=test.flags", "--fromenv=iterations"]) == 0
    assert "] Running for 4 iterations." in capsys.readouterr().err
    assert main(["test", "--flagfile=test.flags", "--tryfromenv=iterations,gpu"]) == 0
    assert "] Running for 4 iterations." in capsys.readouterr().err
    assert main(["test", "--flagfile=test.flags", "--fromenv=gpu"]) == 2
    assert "FLAGS_gpu not found in the environment" in capsys.readouterr().err
    assert main(["test", "--flagfile=absent.flags"]) == 2
    assert "--flagfile: cannot read 'absent.flags'" in capsys.readouterr().err


def test_a_glog_flag_is_taken_with_a_note_that_it_has_no_effect(case, capsys):
    code = main(["time", "-model", "train.prototxt", "-iterations", "1", "-v", "2"])
    assert code == 0
    err = capsys.readouterr().err
    assert "torchcaffe time: note: glog's -v has no effect" in err


def test_log_dir_gets_glogs_files_as_caffes_tools_write_them(case, capsys, monkeypatch):
    """-log_dir (or GLOG_log_dir): each severity's lines in glog's file, linked as
    ``caffe.INFO`` & co. (what pipelines hand parse_log.py), besides stderr; a second run
    moves the links to its own files. -logtostderr writes none."""
    monkeypatch.delenv("GLOG_log_dir", raising=False)
    argv = ["test", "-model", "train.prototxt", "-weights", "final.caffemodel"]
    logs = case / "logs"
    logs.mkdir()
    assert main([*argv, "-iterations", "2", "-log_dir", str(logs)]) == 0
    err = capsys.readouterr().err
    info = (logs / "caffe.INFO").read_text()
    header, lines = info.splitlines()[:3], info.splitlines()[3:]
    assert header[0].startswith("Log file created at: ") and header[1].startswith("Running on")
    assert lines == [line for line in err.splitlines() if re.match(r"[IWE]\d{4} ", line)]
    assert any(line.endswith("] Batch 1, loss = " + line.rsplit(" = ", 1)[-1]) for line in lines)
    target = os.readlink(logs / "caffe.INFO")
    assert re.fullmatch(r"caffe\..+\.log\.INFO\.\d{8}-\d{6}\.\d+(\.\d)?", target)
    assert not (logs / "caffe.ERROR").exists()  # created at its first line
    monkeypatch.setenv("GLOG_log_dir", str(logs))
    assert main([*argv, "-iterations", "1"]) == 0
    assert (logs / "caffe.INFO").read_text().count("] Batch ") == 1  # the newest run's file
    assert main([*argv, "-iterations", "1", "-logtostderr"]) == 0
    assert main([*argv, "-iterations", "1", "-log_dir", str(case / "absent")]) == 0
    assert "Could not create log file: " in capsys.readouterr().err
    names = sorted(p.name for p in logs.iterdir())  # no warning: no WARNING file
    assert names[0] == "caffe.INFO" and len(names) == 3 and ".log.INFO." in names[2]


@pytest.mark.parametrize(
    "argv,head",
    [
        ([], "no action given"),
        (["-solver", "solver.prototxt"], "no action given"),  # the action forgotten
        (["tarin", "-solver", "solver.prototxt"], "unknown action 'tarin'"),
    ],
)
def test_no_or_an_unknown_action_is_one_line_naming_the_actions(capsys, argv, head):
    """Caffe's tool shows its usage (the actions) without an action; here one line that
    names them, not argparse's "invalid choice: 'solver.prototxt'" for a flag's value."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"torchcaffe: error: {head}; ") and err.count("\n") == 1
    assert all(name in err for name in ("train", "test", "time", "device_query"))


@pytest.mark.parametrize("flag", ["-help", "--help", "-h"])
def test_gflags_help_spellings_show_the_help(capsys, flag):
    with pytest.raises(SystemExit) as exit_:
        main([flag])
    assert exit_.value.code == 0 and "usage: torchcaffe" in capsys.readouterr().out


@pytest.mark.parametrize("flag", ["-version", "--version"])
def test_gflags_version_flag_prints_the_version(capsys, flag):
    """gflags' builtin ``--version`` (``caffe version 1.0.0``): ours names torchcaffe's."""
    assert main([flag]) == 0
    assert capsys.readouterr().out == f"torchcaffe version {caffe.__version__}\n"


def test_a_refused_python_layer_names_the_command_line_flag(tmp_path, capsys, monkeypatch):
    """Caffe's tool runs Python layers; ours asks for an opt-in, and a command-line user is
    told the flag that gives it (not only the Python keyword)."""
    monkeypatch.delenv("TORCHCAFFE_ALLOW_PYTHON_LAYERS", raising=False)
    model = tmp_path / "py.prototxt"
    model.write_text(
        'layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 dim: 2 } } }\n'
        'layer { name: "py" type: "Python" bottom: "x" top: "y"\n'
        '  python_param { module: "nowhere_module" layer: "Nothing" } }\n'
    )
    assert main(["time", "-model", str(model), "-iterations", "1"]) == 2
    err = _without_log_lines(capsys.readouterr().err)
    assert err.count("\n") == 1 and "-allow_python_layers" in err


def test_glog_prefix_names_the_os_thread_id_as_glog_does():
    """glog writes GetTID() (gettid: the process id in the main thread), padded to 5 columns;
    Python's thread ident is a 15-digit address, which no Caffe log carries."""
    record = logging.LogRecord("torchcaffe", logging.INFO, "solver.py", 7, "hi", None, None)
    line = GlogFormatter().format(record)
    assert line.endswith(" solver.py:7] hi")
    tid = line.split()[2]
    assert tid == str(threading.get_native_id())
    assert line[22:28] == f"{tid:>5} "  # right-aligned in 5 columns after the time


def test_time_names_the_model_file_in_a_build_error(tmp_path, capsys):
    """time builds the net from its NetParameter (to set force_backward), so the file is
    named by the tool: a wiring error says which prototxt."""
    model = tmp_path / "wired.prototxt"
    model.write_text(
        'layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 dim: 2 } } }\n'
        'layer { name: "r" type: "ReLU" bottom: "nope" top: "r" }\n'
    )
    assert main(["time", "-model", str(model), "-iterations", "1"]) == 2
    err = _without_log_lines(capsys.readouterr().err)
    assert err.startswith(f"torchcaffe time: error: {model}: layer 'r' (ReLU): unknown bottom")
