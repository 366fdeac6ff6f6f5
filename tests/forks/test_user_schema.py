"""A fork's own caffe.proto at run time (formats/user_schema.py, docs/forks.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torchcaffe
from torchcaffe import registry
from torchcaffe.errors import PrototxtError, SchemaError
from torchcaffe.formats import user_schema
from torchcaffe.formats.prototxt import read_solver
from torchcaffe.ops.base import CaffeLayer, Exactly
from torchcaffe.proto import caffe_pb2

from .conftest import EXAMPLE_DIR, make_fork_proto, run_with_fork_module

ROOT_NET = EXAMPLE_DIR / "net.prototxt"

# The made-up fork: a layer-param message at a new LayerParameter field, a new field in
# ConvolutionParameter, a new SolverParameter field.
FORK_EDITS = [
    (
        "message LayerParameter {\n",
        "message LayerParameter {\n  optional GateParameter gate_param = 4242;\n",
    ),
    (
        "message ConvolutionParameter {\n",
        "message ConvolutionParameter {\n  optional float fork_lr_hint = 4243 [default = 1];\n",
    ),
    (
        "message SolverParameter {\n",
        "message SolverParameter {\n  optional string fork_tag = 4244;\n",
    ),
    (
        "message NetParameter {\n",
        "message GateParameter {\n  optional float gate_bias = 1;\n}\n\nmessage NetParameter {\n",
    ),
]

WRITER = """
import numpy as np
from google.protobuf import text_format
net = fork_pb2.NetParameter(name="gated")
data = net.layer.add(name="data", type="Input", top=["data"])
data.input_param.shape.add(dim=[2, 3, 5, 5])
conv = net.layer.add(name="conv1", type="Convolution", bottom=["data"], top=["conv1"])
conv.convolution_param.num_output = 4
conv.convolution_param.kernel_size.append(3)
conv.convolution_param.fork_lr_hint = 0.5
gate = net.layer.add(name="gate1", type="TestGate", bottom=["conv1"], top=["gate1"])
gate.gate_param.gate_bias = 0.25
open("net.binaryproto", "wb").write(net.SerializeToString())
open("net.prototxt", "w").write(text_format.MessageToString(net))
rng = np.random.default_rng(0)
arrays = {"w": rng.standard_normal((4, 3, 3, 3)), "b": rng.standard_normal(4),
          "g": rng.standard_normal(4)}
arrays = {k: v.astype(np.float32) for k, v in arrays.items()}
np.savez("blobs.npz", **arrays)
for layer, names in ((net.layer[1], "wb"), (net.layer[2], "g")):
    for n in names:
        blob = layer.blobs.add()
        blob.shape.dim.extend(arrays[n].shape)
        blob.data.extend(arrays[n].ravel().tolist())
open("model.caffemodel", "wb").write(net.SerializeToString())
"""


class GateLayer(CaffeLayer):
    """y = x * sigmoid(gate[c] + gate_bias), reading the fork's ``gate_param``."""

    bottoms = Exactly(1)
    tops = Exactly(1)
    param_field = "gate_param"

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        self.bias = float(self.param.gate_bias)
        self.add_blob("gate", (self.bottom_shapes[0][1],), value=0.0)

    def forward(self, x):
        return x * torch.sigmoid(self.gate + self.bias).reshape(1, -1, 1, 1)


@pytest.fixture
def gate_layer():
    registry.register_layer("TestGate", fork="tests")(GateLayer)
    yield GateLayer
    registry._LAYERS.pop("TestGate")


@pytest.fixture
def fork(tmp_path):
    proto = make_fork_proto(tmp_path, FORK_EDITS)
    run_with_fork_module(proto, WRITER, tmp_path)
    return proto


@pytest.mark.parametrize("net_file", ["net.binaryproto", "net.prototxt"])
def test_fork_net_and_caffemodel_written_by_the_fork_load_and_run(fork, gate_layer, net_file):
    folder = fork.parent
    net = torchcaffe.load(
        folder / net_file, folder / "model.caffemodel", phase="train", caffe_proto=fork
    )
    gate = net.layers["gate1"]
    assert type(gate.param).DESCRIPTOR.full_name == "caffe.GateParameter"
    assert gate.param.gate_bias == pytest.approx(0.25)
    schema = user_schema.load_schema(fork)
    conv_param = user_schema.fork_param(
        schema, net.layers["conv1"].layer_param, "convolution_param"
    )
    assert conv_param.fork_lr_hint == pytest.approx(0.5)  # the fork field stays reachable
    blobs = np.load(folder / "blobs.npz")
    w, b, g = (torch.from_numpy(blobs[k]) for k in "wbg")
    torch.testing.assert_close(gate.gate.detach(), g)  # weights I/O of the custom layer
    x = torch.randn(2, 3, 5, 5)
    out = net(data=x)["gate1"]
    g_ref = g.clone().requires_grad_(True)
    ref = F.conv2d(x, w, b) * torch.sigmoid(g_ref + 0.25).reshape(1, -1, 1, 1)
    torch.testing.assert_close(out, ref)
    out.square().sum().backward()
    ref.square().sum().backward()
    torch.testing.assert_close(gate.gate.grad, g_ref.grad)


def test_caffe_face_takes_caffe_proto(fork, gate_layer):
    folder = fork.parent
    net = torchcaffe.Net(
        str(folder / "net.prototxt"),
        torchcaffe.TEST,
        weights=str(folder / "model.caffemodel"),
        caffe_proto=str(fork),
    )
    np.testing.assert_array_equal(net.params["gate1"][0].data, np.load(folder / "blobs.npz")["g"])
    net.blobs["data"].data[...] = 1.0
    assert np.isfinite(net.forward()["gate1"]).all()


def test_fork_solver_field_parses(fork, tmp_path):
    solver = tmp_path / "solver.prototxt"
    solver.write_text('net: "n.prototxt"\nbase_lr: 0.1\nfork_tag: "mine"\n')
    with pytest.raises(PrototxtError, match="fork_tag"):
        read_solver(solver)
    with user_schema.use_schema(fork):
        param = read_solver(solver)
    assert isinstance(param, caffe_pb2.SolverParameter)
    assert param.base_lr == pytest.approx(0.1)


def test_schema_is_cached_by_content(fork):
    assert user_schema.load_schema(fork) is user_schema.load_schema(str(fork))


def test_unknown_field_without_caffe_proto_names_file_line_layer_and_hint():
    with pytest.raises(PrototxtError) as info:
        torchcaffe.load(ROOT_NET)
    err = info.value
    line = next(
        i for i, row in enumerate(ROOT_NET.read_text().splitlines(), 1) if "fork_lr_hint:" in row
    )
    assert err.path == str(ROOT_NET)
    assert err.line == line
    assert err.layer == "conv1"
    assert "fork_lr_hint" in str(err)
    assert "caffe_proto=" in str(err)


@pytest.mark.parametrize(
    ("edit", "theirs", "ours"),
    [
        (  # same number, another name
            ("  repeated uint32 pad = 3;", "  optional float hint = 3;"),
            "ConvolutionParameter.hint = 3 (float",
            "ConvolutionParameter.pad = 3 (repeated uint32, proto/caffe.proto)",
        ),
        (  # same name, another number
            ("optional uint32 num_output = 1;", "optional uint32 num_output = 4250;"),
            "ConvolutionParameter.num_output = 4250 (uint32",
            "ConvolutionParameter.num_output = 1 (uint32, proto/caffe.proto)",
        ),
        (  # same name and number, another type
            ("optional bool bias_term = 2 [default = true];", "optional int32 bias_term = 2;"),
            "ConvolutionParameter.bias_term = 2 (int32",
            "ConvolutionParameter.bias_term = 2 (bool, proto/caffe.proto)",
        ),
    ],
)
def test_clash_names_both_definitions(tmp_path, edit, theirs, ours):
    proto = make_fork_proto(tmp_path, [edit])
    with pytest.raises(SchemaError) as info:
        user_schema.load_schema(proto)
    message = str(info.value)
    assert theirs in message and str(proto) in message
    assert ours in message


BROCOLLI_EDITS = [  # brocolli's PoolingParameter: ceil_mode at 13, no round_mode
    ("  optional RoundMode round_mode = 13 [default = CEIL];\n", ""),
    (
        "optional bool ceil_mode = 10013 [default = true];",
        "optional bool ceil_mode = 13 [default = true];",
    ),
]
BROCOLLI_WRITER = """
net = fork_pb2.NetParameter(name="pool")
data = net.layer.add(name="data", type="Input", top=["data"])
data.input_param.shape.add(dim=[1, 1, 6, 6])
pool = net.layer.add(name="pool", type="Pooling", bottom=["data"], top=["pool"])
pool.pooling_param.kernel_size = 3
pool.pooling_param.stride = 2
pool.pooling_param.ceil_mode = False
open("pool.binaryproto", "wb").write(net.SerializeToString())
"""


def test_binary_net_with_brocolli_ceil_mode_at_13_is_mapped(tmp_path):
    proto = make_fork_proto(tmp_path, BROCOLLI_EDITS)
    run_with_fork_module(proto, BROCOLLI_WRITER, tmp_path)
    net = torchcaffe.load(tmp_path / "pool.binaryproto", caffe_proto=proto)
    # ceil_mode: false is FLOOR: (6 - 3) / 2 + 1 = 2 (CEIL would give 3)
    assert net.blob_shapes["pool"] == (1, 1, 2, 2)


def test_missing_compiler_names_the_extra(tmp_path, monkeypatch):
    proto = make_fork_proto(
        tmp_path, [("message NetParameter {\n", "// x\nmessage NetParameter {\n")]
    )
    monkeypatch.setitem(__import__("sys").modules, "grpc_tools", None)
    with pytest.raises(SchemaError, match=r"torchcaffe\[forks\]"):
        user_schema.load_schema(proto)


def test_fork_param_field_without_schema_is_a_clear_error(gate_layer, tmp_path):
    net = caffe_pb2.NetParameter()
    net.layer.add(name="data", type="Input", top=["data"]).input_param.shape.add(dim=[1, 2, 3, 3])
    net.layer.add(name="g", type="TestGate", bottom=["data"], top=["g"])
    with pytest.raises(torchcaffe.TorchCaffeError, match="gate_param.*caffe_proto"):
        torchcaffe.load(net)


def test_a_proto_that_does_not_compile_is_a_schema_error(tmp_path):
    edit = (
        "message ConvolutionParameter {\n",
        "message ConvolutionParameter {\n  optional float x = 3;\n",
    )
    proto = make_fork_proto(tmp_path, [edit])
    with pytest.raises(SchemaError, match="protoc cannot compile.*3"):
        user_schema.load_schema(proto)


def test_cli_takes_caffe_proto(fork, gate_layer, capsys):
    from torchcaffe.cli.__main__ import main

    net = str(fork.parent / "net.prototxt")
    assert main(["run", net, "-caffe_proto", str(fork)]) == 0
    assert "gate1" in capsys.readouterr().out
    assert main(["run", net]) == 2
    err = capsys.readouterr().err
    assert "layer 'conv1'" in err and "fork_lr_hint" in err and "--caffe-proto" in err


SEGNET_EDITS = [  # SegNet's UpsampleParameter: uint32 scale (default 2), scale_h at 2, no dims_num
    ("optional int32 scale = 1 [default = 1];", "optional uint32 scale = 1 [default = 2];"),
    ("  optional int32 dims_num = 2 [default = 4];\n", ""),
    ("optional uint32 scale_h = 10002;", "optional uint32 scale_h = 2;"),
]
SEGNET_WRITER = """
net = fork_pb2.NetParameter(name="up")
data = net.layer.add(name="data", type="Input", top=["data", "mask"])
data.input_param.shape.add(dim=[1, 2, 3, 3])
data.input_param.shape.add(dim=[1, 2, 3, 3])
up = net.layer.add(name="up", type="Upsample", bottom=["data", "mask"], top=["up"])
up.upsample_param.scale_h = 3
up.upsample_param.scale_w = 2
open("up.binaryproto", "wb").write(net.SerializeToString())
"""


def test_binary_net_with_segnet_scale_h_at_2_is_mapped(tmp_path):
    proto = make_fork_proto(tmp_path, SEGNET_EDITS)
    run_with_fork_module(proto, SEGNET_WRITER, tmp_path)
    net = torchcaffe.load(tmp_path / "up.binaryproto", caffe_proto=proto)
    param = net.layers["up"].param
    assert param.scale_h == 3 and not param.HasField("dims_num")
    assert net.blob_shapes["up"] == (1, 2, 9, 6)


def test_get_solver_takes_caffe_proto(fork, gate_layer, tmp_path):
    solver = tmp_path / "solver.prototxt"
    net = (fork.parent / "net.prototxt").as_posix()
    solver.write_text(
        f'net: "{net}"\nbase_lr: 0.1\nlr_policy: "fixed"\nfork_tag: "mine"\ntype: "Adam"\n'
    )
    s = torchcaffe.get_solver(str(solver), caffe_proto=str(fork))
    assert type(s).__name__ == "AdamSolver"
    assert "gate1" in s.net.params


@pytest.mark.parametrize(
    ("text", "line", "layer"),
    [
        ('layer {\n  name: "a"\n  bad: 1\n}\n', 3, "a"),
        ('layers\n{\n  name: "v1" # { not a brace\n  p { x: "}" bad: 1 }\n}\n', 4, "v1"),
        ('layer { name: "a" }\nlayer {\n  type: "T"\n  name: "b"\n  q { bad: 2 }\n}', 5, "b"),
        ('name: "net"\nbad: 1\n', 2, None),
    ],
)
def test_layer_at_finds_the_enclosing_layer(text, line, layer):
    from torchcaffe.formats.prototxt import _layer_at

    assert _layer_at(text, line) == layer


def test_an_enum_value_only_the_fork_has_is_an_error_naming_where(tmp_path):
    proto = make_fork_proto(tmp_path, [("STOCHASTIC = 2;", "STOCHASTIC = 2;\n    LP = 3;")])
    net = tmp_path / "pool.prototxt"
    net.write_text(
        'layer { name: "data" type: "Input" top: "data" '
        "input_param { shape { dim: 1 dim: 1 dim: 4 dim: 4 } } }\n"
        'layer { name: "p" type: "Pooling" bottom: "data" top: "p" '
        "pooling_param { pool: LP kernel_size: 2 } }\n"
    )
    with pytest.raises(SchemaError) as info:
        torchcaffe.load(net, caffe_proto=proto)
    message = str(info.value)
    assert str(net) in message
    assert "layer['p'].pooling_param.pool is LP (3)" in message


def test_unknown_enum_value_without_caffe_proto_names_the_layer_and_hints():
    text = (
        'layer { name: "data" type: "Input" top: "data" }\n'
        'layer {\n  name: "p"\n  type: "Pooling"\n  pooling_param { pool: LP }\n}\n'
    )
    with pytest.raises(PrototxtError) as info:
        torchcaffe.load(text)
    assert info.value.layer == "p" and info.value.line == 5
    assert "LP" in str(info.value) and "caffe_proto=" in str(info.value)
