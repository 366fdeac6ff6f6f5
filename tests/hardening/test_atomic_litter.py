"""Interrupted saves (issue 13, finding 7): the target survives a kill -9 mid-save, the
temporary file left behind has a name a user recognises, and the next save of the same target
removes it without touching a save still in progress."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import torchcaffe
from torchcaffe.errors import FileWriteError
from torchcaffe.formats.atomic import TEMP_MARK, atomic_write, temp_files_of
from torchcaffe.formats.prototxt import read_net

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL and flock are POSIX")

WRITER = textwrap.dedent(
    """
    import sys, time
    from torchcaffe.formats import atomic
    with atomic.atomic_write(sys.argv[1], "wb") as f:
        f.write(b"partial" * 100000)
        f.flush()
        print("writing", flush=True)
        time.sleep(120)
    """
)


def _killed_mid_save(target) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(target)],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    try:
        assert proc.stdout.readline().strip() == "writing"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        proc.stdout.close()


def test_kill_mid_save_keeps_the_target_and_the_next_save_removes_the_litter(tmp_path):
    target = tmp_path / "model.caffemodel"
    target.write_bytes(b"previous model")
    _killed_mid_save(target)
    first = temp_files_of(target)
    _killed_mid_save(target)  # its own save first removes the first one's litter
    assert target.read_bytes() == b"previous model"
    litter = temp_files_of(target)
    assert len(first) == len(litter) == 1 and first != litter
    for name in litter:  # visible (no leading dot) and named after the target
        assert os.path.basename(name).startswith("model.caffemodel" + TEMP_MARK)
    with atomic_write(target) as f:
        f.write(b"new model")
    assert target.read_bytes() == b"new model"
    assert sorted(os.listdir(tmp_path)) == ["model.caffemodel"]


def test_cleanup_leaves_a_live_save_alone(tmp_path):
    target = tmp_path / "m.bin"
    with atomic_write(target) as slow:
        slow.write(b"slow")
        with atomic_write(target) as fast:  # another save of the same target meanwhile
            fast.write(b"fast")
        assert target.read_bytes() == b"fast"
        assert len(temp_files_of(target)) == 1  # the slow save's file survived the cleanup
    assert target.read_bytes() == b"slow"
    assert os.listdir(tmp_path) == ["m.bin"]


def test_cleanup_touches_only_the_same_target(tmp_path):
    other = tmp_path / ("other.caffemodel" + TEMP_MARK + "abcdefgh")
    other.write_bytes(b"x")
    similar = tmp_path / ("m.caffemodel.bak" + TEMP_MARK + "abcdefgh")
    similar.write_bytes(b"x")
    with atomic_write(tmp_path / "m.caffemodel") as f:
        f.write(b"m")
    assert other.exists() and similar.exists()


def test_old_hidden_temp_names_are_cleaned_too(tmp_path):
    old = tmp_path / ".m.caffemodel.k2j4h5g6.tmp"
    old.write_bytes(b"left by an older version")
    with atomic_write(tmp_path / "m.caffemodel") as f:
        f.write(b"m")
    assert not old.exists()


SAVER = textwrap.dedent(
    """
    import sys
    import torchcaffe
    from torchcaffe.formats.prototxt import read_net
    net = torchcaffe.load(read_net(sys.argv[2]))
    print("ready", flush=True)
    while True:
        torchcaffe.save_weights(net, sys.argv[1])
        torchcaffe.save_weights(net, sys.argv[1] + ".h5")
    """
)
NET = """
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 64 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 4096 weight_filler { type: "gaussian" } } }
"""


def test_kill_9_during_real_saves(tmp_path):
    target = tmp_path / "m.caffemodel"
    targets = (target, tmp_path / "m.caffemodel.h5")
    for delay in (0.3,):
        proc = subprocess.Popen(
            [sys.executable, "-c", SAVER, str(target), NET], stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout.readline().strip() == "ready"
            try:
                proc.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                pass
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
            proc.stdout.close()
        for t in targets:
            if t.exists():  # whatever was last published is a whole, loadable model
                torchcaffe.load(read_net(NET), t, strict=True)
    net = torchcaffe.load(read_net(NET))
    for t in targets:
        torchcaffe.save_weights(net, t)
    assert sorted(os.listdir(tmp_path)) == sorted(t.name for t in targets)


def test_solver_snapshot_removes_litter_of_a_killed_snapshot(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.prototxt").write_text(
        NET.replace("dim: 64", "dim: 3").replace("num_output: 4096", "num_output: 2")
    )
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.prototxt"\nbase_lr: 0.1\nlr_policy: "fixed"\nsnapshot_prefix: "snap"\n'
    )
    solver = torchcaffe.SGDSolver("solver.prototxt")
    litter = [
        tmp_path / ("snap_iter_0.caffemodel" + TEMP_MARK + "deadbeef"),
        tmp_path / ("snap_iter_0.solverstate" + TEMP_MARK + "deadbeef"),
    ]
    for name in litter:
        name.write_bytes(b"half a snapshot")
    solver.snapshot()
    assert not any(name.exists() for name in litter)
    assert sorted(os.listdir(tmp_path)) == [
        "net.prototxt",
        "snap_iter_0.caffemodel",
        "snap_iter_0.solverstate",
        "solver.prototxt",
    ]


def test_a_missing_folder_is_reported_by_the_target_name(tmp_path, capsys):
    """The error names the file asked for, not the temporary sibling atomic_write opens."""
    from torchcaffe.cli.__main__ import main

    target = tmp_path / "nowhere" / "o.prototxt"
    with pytest.raises(FileWriteError) as info, atomic_write(target, "w"):
        pass
    assert info.value.filename == str(target) and info.value.errno == errno.ENOENT
    assert isinstance(info.value, OSError) and "its folder" in str(info.value)
    net = tmp_path / "v1.prototxt"
    net.write_text('name: "n"\nlayers { name: "r" type: RELU bottom: "x" top: "x" }\n')
    assert main(["upgrade_net_proto_text", str(net), str(target)]) == 2
    err = capsys.readouterr().err
    assert f"{target}: No such file or directory" in err and "tmp-" not in err


FULL_DISK_SAVER = textwrap.dedent(
    """
    import resource, signal, sys
    import torchcaffe
    from torchcaffe.formats.prototxt import read_net
    net = torchcaffe.load(read_net(sys.argv[1]))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (200, resource.RLIM_INFINITY))
    for path in sys.argv[2:]:
        try:
            torchcaffe.save_weights(net, path, hdf5=path.endswith(".h5"))
        except OSError as err:
            print(err)
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs RLIMIT_FSIZE")
def test_a_write_that_fails_midway_names_the_target_and_keeps_it(tmp_path):
    """A full disk fails the write itself, whose OSError names no file; the error names the
    file asked for, the old file stays and no temporary file is left."""
    text = (
        'layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 dim: 40 } } }\n'
        'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" '
        "inner_product_param { num_output: 40 } }\n"
    )
    targets = [tmp_path / "w.caffemodel", tmp_path / "w.h5"]
    for target in targets:
        target.write_bytes(b"the previous weights")
    script = tmp_path / "saver.py"
    script.write_text(FULL_DISK_SAVER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, str(script), text, *map(str, targets)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and len(lines) == 2, done.stderr
    for target, line in zip(targets, lines):
        assert line == f"{target}: File too large"  # a FileWriteError: an OSError too
        assert target.read_bytes() == b"the previous weights"
        assert temp_files_of(target) == []
