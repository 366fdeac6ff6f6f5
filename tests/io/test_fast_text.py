"""The prototxt fast path reads exactly what protobuf's text_format reads, or steps aside."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from google.protobuf import text_format

from torchcaffe.errors import PrototxtError
from torchcaffe.formats import prototxt as ptx
from torchcaffe.formats.fast_text import parse_fast
from torchcaffe.proto import caffe_pb2 as pb

REPO = Path(__file__).resolve().parents[2]
NETS = sorted(
    p
    for p in [*REPO.glob("tests/golden/**/*.prototxt"), *REPO.glob("examples/**/*.prototxt")]
    if "solver" not in p.name and "forks" not in p.parts
)


def reference(text: str, cls=pb.NetParameter) -> bytes | None:
    """text_format's reading, serialized; None where it refuses the text."""
    msg = cls()
    try:
        text_format.Parse(text, msg)
    except (text_format.ParseError, ValueError, SystemError):
        return None
    return msg.SerializeToString(deterministic=True)


def fast(text: str, cls=pb.NetParameter) -> bytes | None:
    msg = cls()
    return msg.SerializeToString(deterministic=True) if parse_fast(text, msg) else None


def test_every_net_in_the_tree_takes_the_fast_path_with_text_formats_result():
    assert len(NETS) > 100
    for path in NETS:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        want = reference(text)
        if want is None:
            continue  # a case of text_format's errors: the fuzz test covers those
        assert fast(text) == want, path


SOLVER = 'base_lr: 0.01 lr_policy: "step" gamma: 0.1 stepsize: 10 max_iter: 20 type: "Adam"\n'


@pytest.mark.parametrize(
    "text",
    [
        'name: "a\\tb"',  # escapes
        "name: 'x' 'y'",  # adjacent strings concatenate
        "force_backward: 1",
        "layer { name: 'p' pooling_param { pool: 1 } }",  # an enum by number
        "layer < name: 'p' >",
        "input_dim: [1, 2, 3]",  # list syntax
        "input_dim: 010",  # octal
        "input_dim: 0x10",
        "layer { loss_weight: inf }",
        "layer { loss_weight: 1.5f }",
        "layer { loss_weight: -1e-3 }",
        "name: 'a' # comment\n ; layer {}",
    ],
)
def test_what_the_fast_path_leaves_reads_as_text_format_reads_it(text):
    msg = ptx.parse_net_text(text)
    assert msg.SerializeToString(deterministic=True) == reference(text)


@pytest.mark.parametrize(
    "text, message",
    [
        ("name: 'a' name: 'b'", "should not have multiple"),
        ("state { phase: TEST } state { }", "should not have multiple"),
        ("layer { name: 'a' bogus: 1 }", 'has no field named "bogus"'),
        ("layer { name: 'a'", "Expected"),
        ("layer { pooling_param { pool: MAXX } }", "has no value named MAXX"),
        ("input_dim: 4294967296", "out of range"),
        ("layer { convolution_param { num_output: -1 } }", "out of range: -1"),
    ],
)
def test_errors_are_text_formats(text, message):
    with pytest.raises(PrototxtError, match=message) as err:
        ptx.parse_net_text(text)
    assert err.value.line is not None


def test_a_non_utf8_byte_in_a_string_is_text_formats_error():
    with pytest.raises(PrototxtError, match="cannot parse as NetParameter"):
        ptx.parse_net_text(b'name: "caf\xe9"'.decode("unicode_escape").encode("latin-1"))


def test_solvers_take_the_fast_path():
    want = reference(SOLVER, pb.SolverParameter)
    assert want is not None and fast(SOLVER, pb.SolverParameter) == want


def test_parse_text_proto_uses_the_fast_path(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("text_format.Parse ran")

    monkeypatch.setattr(ptx.text_format, "Parse", refuse)
    net = ptx.parse_net_text("name: 'n' layer { name: 'd' type: 'Input' top: 'd' }")
    assert net.layer[0].type == "Input"


def test_random_edits_read_as_text_format_reads_them_or_fall_back():
    rng = random.Random(1701)
    texts = [p.read_text(encoding="utf-8") for p in NETS[:40]]
    alphabet = list("{}:;,#\"'\n -.+0123456789eExf<>[]\\t") + ["\udc80", "é"]
    took_fast = 0
    for _ in range(1500):
        text = rng.choice(texts)
        at = rng.randrange(len(text) + 1)
        roll = rng.random()
        if roll < 0.4:
            text = text[:at] + rng.choice(alphabet) + text[at:]
        elif roll < 0.7:
            text = text[:at] + text[at + 1 :]
        else:
            text = text[:at] + text[at : at + rng.randrange(1, 80)] + text[at:]
        got = fast(text)
        if got is not None:
            took_fast += 1
            assert got == reference(text), repr(text[max(0, at - 40) : at + 40])
    assert took_fast > 100  # the edits that stay valid (comments, whitespace, ...) go fast
