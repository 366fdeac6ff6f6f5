"""upgrade_solver_proto_text, as Caffe's tool: the solver_type enum becomes the type string,
nothing else changes, and the text is printed as Caffe's TextFormat prints it."""

from __future__ import annotations

import pytest

from torchcaffe.cli.__main__ import build_parser, main

OLD = """# LeNet, with the solver type given the old way
net: "examples/mnist/lenet_train_test.prototxt"
test_iter: 100
test_interval: 500
base_lr: 0.01
momentum: 0.9
weight_decay: 0.0005
lr_policy: "inv"
gamma: 0.0001
power: 0.75
display: 100
max_iter: 10000
snapshot: 5000
snapshot_prefix: "examples/mnist/lenet"
solver_mode: CPU
solver_type: NESTEROV
"""
# Caffe's output: fields in field-number order, no comments, snapshot_prefix as it was
NEW = """test_iter: 100
test_interval: 500
base_lr: 0.01
display: 100
max_iter: 10000
lr_policy: "inv"
gamma: 0.0001
power: 0.75
momentum: 0.9
weight_decay: 0.0005
snapshot: 5000
snapshot_prefix: "examples/mnist/lenet"
solver_mode: CPU
net: "examples/mnist/lenet_train_test.prototxt"
type: "Nesterov"
"""


def test_solver_type_becomes_type_as_caffe_writes_it(tmp_path, capsys):
    src, out = tmp_path / "old.prototxt", tmp_path / "new.prototxt"
    src.write_text(OLD)
    assert main(["upgrade_solver_proto_text", str(src), str(out)]) == 0
    assert out.read_text() == NEW
    captured = capsys.readouterr()
    assert "deprecated 'solver_type' field (enum)" in captured.err
    # logged as Caffe's tool logs it (glog, stderr); nothing on stdout
    assert f"] Wrote upgraded SolverParameter text proto to {out}\n" in captured.err
    assert captured.out == ""


@pytest.mark.parametrize(
    "old, new",
    [("SGD", "SGD"), ("ADAGRAD", "AdaGrad"), ("RMSPROP", "RMSProp"), ("ADADELTA", "AdaDelta"),
     ("ADAM", "Adam"), ("1", "Nesterov")],
)  # fmt: skip
def test_every_solver_type(tmp_path, old, new):
    src, out = tmp_path / "old.prototxt", tmp_path / "new.prototxt"
    src.write_text(f"base_lr: 1e-05\nsolver_type: {old}\n")
    assert main(["upgrade_solver_proto_text", str(src), str(out)]) == 0
    assert out.read_text() == f'base_lr: 1e-05\ntype: "{new}"\n'


def test_an_upgraded_solver_is_written_unchanged(tmp_path, capsys):
    src, out = tmp_path / "new.prototxt", tmp_path / "again.prototxt"
    src.write_text(NEW)
    assert main(["upgrade_solver_proto_text", str(src), str(out)]) == 0
    assert out.read_text() == NEW
    assert f"File already in latest proto format: {src}" in capsys.readouterr().err


def test_inline_nets_are_not_upgraded(tmp_path):
    """Caffe's tool upgrades the solver type only: a V1 net inside stays V1."""
    src, out = tmp_path / "old.prototxt", tmp_path / "new.prototxt"
    src.write_text(
        'net_param { name: "n" layers { name: "ip" type: INNER_PRODUCT top: "ip" '
        "blobs_lr: 1 inner_product_param { num_output: 2 } } }\nsolver_type: ADAM\n"
    )
    assert main(["upgrade_solver_proto_text", str(src), str(out)]) == 0
    assert out.read_text() == (
        "net_param {\n"
        '  name: "n"\n'
        "  layers {\n"
        '    top: "ip"\n'
        '    name: "ip"\n'
        "    type: INNER_PRODUCT\n"
        "    blobs_lr: 1\n"
        "    inner_product_param {\n"
        "      num_output: 2\n"
        "    }\n"
        "  }\n"
        "}\n"
        'type: "Adam"\n'
    )


def test_in_place(tmp_path):
    src = tmp_path / "solver.prototxt"
    src.write_text(OLD)
    assert main(["upgrade_solver_proto_text", str(src), str(src)]) == 0
    assert src.read_text() == NEW
    assert [p.name for p in tmp_path.iterdir()] == ["solver.prototxt"]


@pytest.mark.parametrize(
    "text, message",
    [
        (None, "file not found"),
        ("base_lr: 0.01\nsolver_typo: SGD\n", "2:1"),
        ("solver_type: LBFGS\n", "LBFGS"),
        ('solver_type: ADAM\ntype: "Adam"\n', "both the deprecated 'solver_type'"),
    ],
)
def test_errors_are_one_line_and_nothing_is_written(tmp_path, capsys, text, message):
    src, out = tmp_path / "old.prototxt", tmp_path / "new.prototxt"
    if text is not None:
        src.write_text(text)
    assert main(["upgrade_solver_proto_text", str(src), str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and str(src) in err and "Traceback" not in err
    assert not out.exists()


def test_listed_in_the_help():
    parser, actions = build_parser()
    assert "upgrade_solver_proto_text" in actions
    assert "upgrade_solver_proto_text" in parser.format_help()
