"""Opt-in and error text (issue 13, finding 8): only an explicit yes-value of
TORCHCAFFE_ALLOW_PYTHON_LAYERS enables Python layers, and in-memory prototxt text never takes
the file name's place in messages."""

from __future__ import annotations

import pytest

import torchcaffe
from torchcaffe.errors import LayerParamError, PrototxtError, TrustError
from torchcaffe.trust import ENV_VAR, python_layers_allowed


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "True", "yes", "Yes", "on", "ON", " 1 "])
def test_yes_values_enable(monkeypatch, value):
    monkeypatch.setenv(ENV_VAR, value)
    assert python_layers_allowed()


@pytest.mark.parametrize("value", ["", "0", "no", "NO", "off", "Off", "false", "FALSE", "False"])
def test_no_values_disable(monkeypatch, value):
    monkeypatch.setenv(ENV_VAR, value)
    assert not python_layers_allowed()


@pytest.mark.parametrize("value", ["maybe", "2", "enable", "y"])
def test_unrecognised_values_refuse_loudly(monkeypatch, value):
    monkeypatch.setenv(ENV_VAR, value)
    with pytest.raises(TrustError, match=rf"{ENV_VAR}=.*{value}.*1, true, yes, on"):
        python_layers_allowed()


def test_unset_disables(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert not python_layers_allowed()


def _big_text(n: int = 2000) -> str:
    lines = ['layer { name: "data" type: "Input" top: "l0" input_param { shape { dim: 1 } } }']
    lines += [
        f'layer {{ name: "r{i}" type: "ReLU" bottom: "l{i}" top: "l{i + 1}" }}'
        for i in range(n - 1)
    ]
    lines.append('layer { name: "bad" type: "Concat" bottom: "nope" top: "x" }')
    return "\n".join(lines)


def test_load_from_text_names_it_briefly_in_errors():
    with pytest.raises(TorchCaffeError_like()) as info:
        torchcaffe.load(_big_text())
    text = str(info.value)
    assert "<prototxt text>" in text and "layer 'bad'" in text
    assert len(text) < 1000, f"message of {len(text)} characters"


def test_parse_error_of_text_names_it_briefly():
    with pytest.raises(PrototxtError, match=r"^<prototxt text>:\d+:\d+: cannot parse") as info:
        torchcaffe.load('layer { name: "x" type: \n' + "#" * 50_000)
    assert len(str(info.value)) < 1000


def test_built_net_from_text_is_named_not_quoted():
    text = 'layer { name: "d" type: "Input" top: "d" input_param { shape { dim: 1 } } }'
    assert torchcaffe.load(text).path == "<prototxt text>"


def TorchCaffeError_like():  # noqa: N802 - reads as an exception class
    return (LayerParamError, torchcaffe.BlobWiringError)


def test_binary_net_with_a_non_utf8_name_is_a_prototxt_error(tmp_path):
    # found by the fuzz suite: protobuf hands invalid UTF-8 back as bytes, which then broke
    # sorting blob names with a TypeError deep in the builder
    from torchcaffe.proto import caffe_pb2

    net = caffe_pb2.NetParameter()
    lp = net.layer.add(name="in", type="Input", top=["ab"])
    lp.input_param.shape.add().dim.append(1)
    data = net.SerializeToString().replace(b"\x22\x02ab", b"\x22\x02\xff\xfe")
    path = tmp_path / "net.protobin"
    path.write_bytes(data)
    with pytest.raises(PrototxtError, match=r"layer\[0\]\.top\[0\].*UTF-8"):
        torchcaffe.load(str(path))
