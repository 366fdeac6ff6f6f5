"""benchmarks/run.py runs end to end in a tiny configuration and writes its table.

No timing is asserted: the figures depend on the machine; only that every requested row is
there, each hand-written baseline agreed with the compiled net (the runner stops otherwise),
and the results file names the machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import run


def test_runner_writes_one_table_naming_the_machine(models_root, tmp_path):
    out = tmp_path / "results.md"
    run.main(
        [
            "--quick",
            "--only",
            "handwritten,layout,caffe_face,memory,dispatch",
            "--no-compile",
            "--repeat",
            "1",
        ]
        + ["--out", str(out)]
    )
    text = out.read_text()
    assert "Machine: " in text and "torch " in text and "cores" in text
    rows = [
        line
        for line in text.splitlines()
        if line.startswith(("| handwritten", "| layout", "| caffe_face", "| memory", "| dispatch"))
    ]
    assert [r.split(" | ")[1] for r in rows] == [
        "CaffeNet eager inference b1",
        "CaffeNet eager fwd+bwd b2",
        "CaffeNet inference b1, channels_last_layout on",
        "CaffeNet Caffe face forward b1",
        "CaffeNet fwd+bwd b2 saved activations",
        "CaffeNet inference b1 ops",
        "CaffeNet fwd+bwd b2 ops",
    ]
    assert all(r.rstrip(" |").endswith("x") for r in rows)


def test_runner_keeps_each_row_of_a_section_stopped_part_way(models_root, tmp_path, monkeypatch):
    """A device call's time limit kills a run inside a section (a compile): the results file
    already holds every row timed before, written whole, with nothing left beside it."""
    out = tmp_path / "results.md"

    def stopped(args, rows):
        rows.append(run.Row("build", "first row", [0.001], "target", [0.002]))
        raise KeyboardInterrupt  # as a kill: no end of the section, no final write

    monkeypatch.setattr(run, "bench_build", stopped)
    with pytest.raises(KeyboardInterrupt):
        run.main(["--only", "build", "--repeat", "1", "--out", str(out)])
    assert "| build | first row | 1 ms " in out.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["results.md"]


def test_runner_rejects_an_unknown_section(capsys):
    with pytest.raises(SystemExit):
        run.main(["--only", "speed"])
    assert "unknown section" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(run.NETS))
def test_hand_written_baseline_computes_the_same_net(models_root, name):
    # prepare() stops the runner when the baseline disagrees with the compiled net by more
    # than 1e-4 on the softmax; the BatchNorm statistics are calibrated so that a wrong
    # architecture (e.g. a stride at another block) cannot hide behind a saturated softmax.
    net, hand, out, size, _ = run.prepare(name)
    assert out == "prob" and size in (224, 227)


def test_two_prepared_nets_hold_the_same_statistics(models_root):
    """The BatchNorm calibration batch is seeded as the weights are: preparing a net twice
    gives the same net, so scripts that compare two prepared nets by value compare like."""
    first, second = run.prepare("MobileNetV2")[0], run.prepare("MobileNetV2")[0]
    a, b = first.state_dict(), second.state_dict()
    assert a.keys() == b.keys() and any("bn" in key for key in a)
    assert [key for key in a if not torch.equal(a[key], b[key])] == []


@pytest.mark.parametrize("name", sorted(run.NETS))
def test_a_gpu_would_launch_about_what_the_hand_written_model_launches(models_root, name):
    """Eager runs on a GPU are bound by kernel launches. Counted on the meta device (which
    dispatches what a GPU would launch, with no kernel run): the net's forward, and its
    forward+backward, dispatch at most 1.2x the hand-written model's ops. Before the
    launch-lean forms of BatchNorm's statistics, LRN, InnerProduct and the pooling floor,
    the forward+backward dispatched 1.67x (ResNet-50), 1.68x (GoogLeNet), 1.72x
    (MobileNetV2) and 2.8x (CaffeNet), CaffeNet's inference 1.54x."""
    rows: list[run.Row] = []
    args = argparse.Namespace(nets=[name], train_batch=8)
    run.bench_dispatch(args, rows)
    assert [r.what for r in rows] == [f"{name} inference b1 ops", f"{name} fwd+bwd b8 ops"]
    for row in rows:
        assert row.ours[0] <= 1.2 * row.baseline[0], (row.what, row.ours, row.baseline)


def test_solver_step_benchmark_fixes_the_heap_for_both_sides(models_root):
    """``--heap fixed`` runs (in its own process: mallopt changes the whole process) and
    prints the ratio line."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_solver_step.py"
    args = ["--nets", "lenet", "--repeat", "1", "--lenet-batch", "2", "--threads", "1"]
    done = subprocess.run(
        [sys.executable, str(script), *args, "--heap", "fixed"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "fixed heap" in done.stdout and "ratio torch/solver" in done.stdout


def test_runner_refuses_cuda_without_a_gpu(capsys, monkeypatch):
    monkeypatch.setattr(run.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        run.main(["--device", "cuda", "--only", "handwritten"])
    assert "CUDA is not available" in capsys.readouterr().err


def test_pass_ab_runs_one_pass_on_and_off(models_root, capsys):
    """bench_pass_ab: the pass fired on one copy, the outputs agree, one line of figures."""
    from benchmarks import bench_pass_ab

    bench_pass_ab.main(["fuse_relu_into_producer", "--net", "CaffeNet", "--repeat", "1"])
    line = capsys.readouterr().out.strip()
    assert line.startswith("CaffeNet b1, fuse_relu_into_producer (fired 7)")
    assert "median of round ratios" in line
    with pytest.raises(SystemExit, match="no inference pass 'speed'"):
        bench_pass_ab.main(["speed"])


def test_guard_lookup_times_each_compiled_call_per_round(monkeypatch):
    """guard_lookup_seconds: one positive figure per round for each call, read from the
    profiler's record of dynamo's cache lookup; a call that never enters a compiled frame
    has no such record, and a torch that writes none stops the section with a message."""
    import torch

    @torch.compile(backend="eager")
    def step(x):
        return x + 1

    x = torch.zeros(3)
    ours, base = run.guard_lookup_seconds([lambda: step(x), lambda: step(x + 1)], rounds=3, block=2)
    assert len(ours) == len(base) == 3 and all(0 < s < 0.01 for s in ours + base)
    with pytest.raises(SystemExit, match="does not write"):
        run.guard_lookup_seconds([lambda: x + 1], rounds=1, block=1)
    monkeypatch.setattr(run, "LOOKUP_EVENT", "no such record")
    with pytest.raises(SystemExit, match="'no such record'"):
        run.guard_lookup_seconds([lambda: step(x)], rounds=1, block=1)


def _whole_and_broken():
    """Two functions compiled afresh: one whole graph, and one with a graph break (two
    compiled frames a call)."""
    torch._dynamo.reset()

    @torch.compile(backend="eager")
    def whole(x):
        return x + 1

    @torch.compile(backend="eager")
    def broken(x):
        y = x + 1
        torch._dynamo.graph_break()
        return y * 2

    return whole, broken


def test_compiled_rows_name_a_side_that_did_not_run_as_one_graph():
    """compiled_timings leaves the row's name alone where both sides run one compiled graph
    a call, and names a side with a graph break, a side that runs eagerly, and the compiles
    of guards that fail while the row is timed."""
    whole, broken = _whole_and_broken()

    @torch.compile(backend="eager", dynamic=False)
    def reshaped(x):
        return x - 1

    x = torch.zeros(3)
    sizes = iter(range(2, 100))
    ours, base, what = run.compiled_timings("row", lambda: whole(x), lambda: whole(x), 2)
    assert what == "row" and len(ours) == len(base) == 2
    _, _, what = run.compiled_timings("row", lambda: broken(x), lambda: whole(x), 2)
    assert what == "row (ours: 2 compiled frames a call)"
    _, _, what = run.compiled_timings("row", lambda: whole(x), lambda: x + 1, 2)
    assert what == "row (hand-written: 0 compiled frames a call)"
    _, _, what = run.compiled_timings(
        "row", lambda: reshaped(torch.zeros(next(sizes))), lambda: whole(x), 2
    )
    assert what == "row (4 compile(s) while timed)"  # 2 warm-up and 2 timed calls
    torch._dynamo.reset()


def test_compiled_inference_rows_carry_the_notes():
    """inference_rows(compiled=True) times through compiled_timings: a baseline with a graph
    break is named in its row; eager rows keep their names."""
    whole, broken = _whole_and_broken()
    args = argparse.Namespace(batches=(1,), device=torch.device("cpu"), repeat=2)
    rows: list = []
    for mode, compiled in (("compiled", True), ("eager", False)):
        where = ("s", f"net {mode}")
        run.inference_rows(
            args, rows, where, lambda data: whole(data), broken, 4, compiled=compiled
        )
    assert [r.what for r in rows] == [
        "net compiled inference b1 (hand-written: 2 compiled frames a call)",
        "net eager inference b1",
    ]
    torch._dynamo.reset()


def test_guards_section_has_no_rows_without_compile():
    rows: list = []
    run.bench_guards(argparse.Namespace(no_compile=True, nets=["CaffeNet"]), rows)
    assert rows == []


def test_runner_stops_where_inductor_would_write_scalar_kernels(capsys, monkeypatch):
    """A failed vector probe makes every compiled kernel a scalar loop: no table of that."""
    monkeypatch.setattr(run, "inductor_vector_isa", lambda: "none")
    monkeypatch.setattr(run.torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    with pytest.raises(SystemExit):
        run.main(["--only", "guards", "--nets", "CaffeNet"])
    assert "no vector instruction set although this CPU has AVX2" in capsys.readouterr().err


def test_machine_names_inductors_vector_isa_where_compiled_rows_ran():
    assert "inductor vectorizes with avx2" in run.machine("avx2")
    assert "inductor" not in run.machine()


def test_compiled_rows_use_a_fresh_inductor_cache_unless_one_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "shared"))
    with run.inductor_cache(None):
        fresh = Path(run.os.environ["TORCHINDUCTOR_CACHE_DIR"])
        assert fresh.is_dir() and fresh != tmp_path / "shared"
    assert not fresh.exists()
    assert run.os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "shared")
    with run.inductor_cache(tmp_path / "mine"):
        assert run.os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")
