"""Text/binary proto reading and writing: error locations, format detection, atomic writes."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from torchcaffe.errors import FileWriteError, PrototxtError, SolverError
from torchcaffe.formats import atomic as atomic_mod
from torchcaffe.formats import prototxt as ptx
from torchcaffe.formats.atomic import atomic_write
from torchcaffe.formats.prototxt import (
    parse_net_text,
    read_net,
    read_net_binary,
    read_net_text,
    read_solver,
    write_binary,
    write_text,
)
from torchcaffe.proto import caffe_pb2 as pb

CURRENT = """name: "tiny"
layer {
  name: "data"
  type: "Input"
  top: "data"
  input_param { shape { dim: 2 dim: 3 } }
}
layer {
  name: "ip"
  type: "InnerProduct"
  bottom: "data"
  top: "ip"
  inner_product_param { num_output: 4 }
}
"""


@pytest.fixture
def tiny() -> pb.NetParameter:
    return parse_net_text(CURRENT)


def listing(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# -- malformed and missing files -------------------------------------------------------------


@pytest.mark.parametrize(
    "text,line,column,what",
    [
        ('name: "x"\nlayer {\n  name: "a"\n  nme: "b"\n}\n', 4, 3, 'no field named "nme"'),
        ('layer {\n  name: "a"\n  convolution_param { pad: 1.5 }\n}\n', 3, 28, "integer"),
        ("layer { type: CONV }\n", 1, 15, "string"),
    ],
)
def test_malformed_text_reports_file_line_and_column(tmp_path, text, line, column, what):
    path = tmp_path / "bad.prototxt"
    path.write_text(text)
    with pytest.raises(PrototxtError) as info:
        read_net(path)
    err = info.value
    assert (err.line, err.column) == (line, column)
    assert str(err).startswith(f"{path}:{line}:{column}: ")
    assert what in str(err)


def test_unterminated_message_is_reported_with_a_location(tmp_path):
    path = tmp_path / "cut.prototxt"
    path.write_text('layer {\n  name: "a"\n')
    with pytest.raises(PrototxtError, match=rf'^{path}:\d+:\d+: .*Expected "}}"') as info:
        read_net(path)
    assert info.value.line in (2, 3)  # protobuf points at the last token or at the end


def test_malformed_text_given_as_string_is_located():
    with pytest.raises(PrototxtError, match=r"^<prototxt text>:2:3: .*no field named \"nme\""):
        read_net('name: "x"\n  nme: 1\n')


def test_missing_file_is_named(tmp_path):
    path = tmp_path / "absent.prototxt"
    with pytest.raises(PrototxtError, match=rf"{path}: file not found"):
        read_net(path)


def test_missing_path_with_colon_is_still_a_path(tmp_path):
    path = tmp_path / "run:1" / "deploy.prototxt"
    with pytest.raises(PrototxtError, match="deploy.prototxt: file not found"):
        read_net(str(path))


def test_directory_is_refused(tmp_path):
    with pytest.raises(PrototxtError, match="directory"):
        read_net_text(tmp_path)


def test_corrupt_binary_is_named(tmp_path, tiny):
    path = tmp_path / "w.caffemodel"
    path.write_bytes(tiny.SerializeToString()[:-5])
    with pytest.raises(PrototxtError, match=rf"{path}: not a valid binary NetParameter"):
        read_net(path)


def test_text_with_binary_extension_is_refused(tmp_path):
    path = tmp_path / "w.caffemodel"
    path.write_text(CURRENT)
    with pytest.raises(PrototxtError, match="not a valid binary"):
        read_net(path)


def test_file_mixing_layer_and_layers_is_refused(tmp_path):
    path = tmp_path / "mixed.prototxt"
    path.write_text('layers { name: "r" type: RELU }\nlayer { name: "s" type: "Softmax" }\n')
    with pytest.raises(PrototxtError, match=rf"{path}: .*both 'layer' and 'layers'"):
        read_net(path)
    raw = read_net(path, upgrade=False)
    assert (len(raw.layer), len(raw.layers)) == (1, 1)


# -- format detection ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["net", "net.bin", "net.caffemodel", "net.pb"])
def test_binary_net_is_detected(tmp_path, tiny, name):
    path = tmp_path / name
    write_binary(tiny, path)
    assert read_net(path) == tiny


def test_binary_net_that_is_valid_utf8_is_detected(tmp_path):
    net = pb.NetParameter(name="tiny")
    data = net.SerializeToString()
    data.decode("utf-8")  # the point of the test: these bytes also look like text
    path = tmp_path / "net"
    path.write_bytes(data)
    assert read_net(path) == net


@pytest.mark.parametrize("name", ["net", "net.cfg", "net.prototxt", "net.pbtxt"])
def test_text_net_is_detected(tmp_path, tiny, name):
    path = tmp_path / name
    path.write_text(CURRENT)
    assert read_net(path) == tiny


def test_read_net_accepts_text_and_str_paths(tmp_path, tiny):
    path = tmp_path / "n.prototxt"
    path.write_text(CURRENT)
    assert read_net(CURRENT) == tiny
    assert read_net('name: "tiny"') == pb.NetParameter(name="tiny")
    assert read_net(str(path)) == tiny


def test_read_net_upgrades_legacy_text(tmp_path):
    path = tmp_path / "v1.prototxt"
    path.write_text(
        'input: "x" input_dim: 1 input_dim: 2 input_dim: 3 input_dim: 4\n'
        'layers { name: "r" type: RELU bottom: "x" top: "x" }\n'
    )
    out = read_net(path)
    assert [(layer.name, layer.type) for layer in out.layer] == [("input", "Input"), ("r", "ReLU")]
    assert len(read_net(path, upgrade=False).layers) == 1


def test_text_with_stray_non_utf8_comment_bytes_parses(tmp_path, tiny):
    path = tmp_path / "n.prototxt"
    path.write_bytes(b"# r\xe9seau (latin-1 comment)\n" + CURRENT.encode())
    assert read_net(path) == tiny


# -- round trips ---------------------------------------------------------------------------


def test_text_round_trip(tmp_path, tiny):
    path = tmp_path / "out.prototxt"
    write_text(tiny, path)
    assert read_net_text(path) == tiny
    assert path.read_text().startswith('name: "tiny"\nlayer {\n  name: "data"')


def test_binary_round_trip_keeps_blobs(tmp_path, tiny):
    tiny.layer[1].blobs.add().data.extend([1.5, -2.0])
    path = tmp_path / "out.caffemodel"
    write_binary(tiny, path)
    assert read_net_binary(path) == tiny


def test_solver_round_trip_with_upgrades(tmp_path):
    path = tmp_path / "lenet_solver.prototxt"
    write_text(pb.SolverParameter(base_lr=0.5, solver_type=pb.SolverParameter.NESTEROV), path)
    out = read_solver(path)
    assert (out.type, out.HasField("solver_type")) == ("Nesterov", False)
    assert out.snapshot_prefix == str(tmp_path / "lenet_solver")
    assert read_solver(path, upgrade=False).solver_type == pb.SolverParameter.NESTEROV


def test_solver_with_both_types_names_the_file(tmp_path):
    path = tmp_path / "s.prototxt"
    path.write_text("solver_type: ADAM\ntype: 'Adam'\n")
    with pytest.raises(SolverError, match=rf"{path}: .*solver_type"):
        read_solver(path)


# -- atomic writes -------------------------------------------------------------------------


def test_atomic_write_failure_midway_keeps_original_and_leaves_no_temp(tmp_path):
    target = tmp_path / "w.caffemodel"
    target.write_bytes(b"original")
    with pytest.raises(RuntimeError, match="disk on fire"):
        with atomic_write(target) as f:
            f.write(b"half a model")
            raise RuntimeError("disk on fire")
    assert target.read_bytes() == b"original"
    assert listing(tmp_path) == ["w.caffemodel"]


def test_write_binary_failing_after_writing_keeps_original(tmp_path, tiny, monkeypatch):
    target = tmp_path / "w.caffemodel"
    target.write_bytes(b"original")

    def boom(*args, **kwargs):
        raise OSError("no space left on device")

    monkeypatch.setattr(atomic_mod.os, "fsync", boom)
    with pytest.raises(OSError, match="no space"):
        write_binary(tiny, target)
    monkeypatch.undo()
    assert target.read_bytes() == b"original"
    assert listing(tmp_path) == ["w.caffemodel"]


def test_write_text_failing_serialization_keeps_original(tmp_path, tiny, monkeypatch):
    target = tmp_path / "n.prototxt"
    target.write_text("original")
    monkeypatch.setattr(
        ptx, "caffe_text", lambda msg: (_ for _ in ()).throw(ValueError("cannot print"))
    )
    with pytest.raises(ValueError, match="cannot print"):
        write_text(tiny, target)
    assert target.read_text() == "original"
    assert listing(tmp_path) == ["n.prototxt"]


def test_atomic_write_to_a_directory_names_it_and_writes_nothing(tmp_path):
    """The error names the path asked for (not the temporary file), before any byte."""
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(FileWriteError) as err:  # a TorchCaffeError, and an OSError
        with atomic_write(target) as f:
            f.write(b"x")
    assert err.value.filename == str(target) and err.value.errno == errno.EISDIR
    assert listing(tmp_path) == ["out"] and listing(target) == []


def test_atomic_write_replaces_and_keeps_permissions(tmp_path):
    target = tmp_path / "n.prototxt"
    target.write_text("old")
    os.chmod(target, 0o640)
    with atomic_write(target, "w") as f:
        f.write("new")
    assert target.read_text() == "new"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640
    assert listing(tmp_path) == ["n.prototxt"]


def test_atomic_write_new_file_follows_umask(tmp_path):
    target = tmp_path / "new.bin"
    old = os.umask(0o027)
    try:
        with atomic_write(target) as f:
            f.write(b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640


@pytest.mark.parametrize("mode", ["rb", "ab", "r+"])
def test_atomic_write_refuses_non_write_modes(tmp_path, mode):
    with pytest.raises(ValueError, match="write mode"):
        with atomic_write(tmp_path / "x", mode):
            pass


@pytest.mark.parametrize(
    "value, text",
    [
        (1.0, "1"),
        (0.01, "0.01"),
        (1e-05, "1e-05"),
        (1e6, "1e+06"),  # %g switches to an exponent at 6 digits; Python's repr at 16
        (1.5e6, "1.5e+06"),
        (16777216.0, "16777216"),
        (123456789.0, "123456792"),  # the float's 9 digits, not Python's "123456790"
        (0.1234567, "0.123456702"),  # 6 digits do not read back: 9 (FLT_DIG + 3)
        (104.00699, "104.006989"),
        (float("inf"), "inf"),
        (float("-inf"), "-inf"),
        (-0.0, "-0"),
    ],
)
def test_caffe_text_spells_floats_as_cpp_simple_ftoa(value, text):
    """protobuf's FloatToBuffer: %.6g when it reads back as the same float, else %.9g."""
    assert ptx.caffe_text(pb.SolverParameter(base_lr=value)) == f"base_lr: {text}\n"


@pytest.mark.parametrize(
    "value, text", [(0.1, "0.1"), (1 / 3, "0.33333333333333331"), (1e20, "1e+20"), (2.0, "2")]
)
def test_caffe_text_spells_doubles_as_cpp_simple_dtoa(value, text):
    """DoubleToBuffer: %.15g when it reads back as the same double, else %.17g."""
    blob = pb.BlobProto(double_data=[value])
    assert ptx.caffe_text(blob) == f"double_data: {text}\n"


def test_caffe_text_escapes_non_ascii_bytes_in_octal():
    """C++ TextFormat's default CEscape: bytes outside printable ASCII as \\ooo, and the
    usual \\n \\t \\" \\' \\\\ escapes."""
    net = pb.NetParameter(name="сеть\"'\\\t\n")
    want = 'name: "\\321\\201\\320\\265\\321\\202\\321\\214\\"\\\'\\\\\\t\\n"\n'
    assert ptx.caffe_text(net) == want


@pytest.mark.parametrize(
    "text, hint",
    [
        ('layers { name: "c" type: Convolution }', "type: CONVOLUTION (or write it as a current"),
        ('layers { name: "c" type: "INNER_PRODUCT" }', "type: INNER_PRODUCT"),
        ('layers { name: "c" type: "SoftmaxWithLoss" }', "type: SOFTMAX_LOSS"),
        ('layers { name: "c" type: CONVOLUTON }', "did you mean CONVOLUTION?"),
        ('layer { name: "c" type: CONVOLUTION }', 'write the quoted string type: "Convolution"'),
        ('layer { name: "c" type: TANH }', 'type: "TanH"'),
    ],
)
def test_v1_and_v2_type_spellings_mixed_up_get_a_hint(text, hint):
    """Protobuf only says the enum has no such value, or that it expected a string (and our
    fork hint would be wrong): say which spelling each block takes."""
    with pytest.raises(PrototxtError) as err:
        parse_net_text(text)
    assert hint in str(err.value)
    assert "Caffe fork" not in str(err.value)


def test_a_parse_error_on_a_long_line_quotes_only_its_neighbourhood():
    """protobuf quotes the whole line it stopped at: a minified prototxt is one line, and
    its whole text went into the message. The quote keeps 60 characters either side."""
    text = " ".join(f'layer {{ name: "r{i}" type: "ReLU" }}' for i in range(300))
    with pytest.raises(PrototxtError) as err:
        ptx.parse_text_proto(text + " layer { name: ! }", pb.NetParameter)
    message = str(err.value)
    assert len(message) < 300 and message.startswith("<prototxt text>:1:")
    assert '\'... "ReLU" } layer { name: "r299" type: "ReLU" } layer { name: ! }\': Exp' in message
    with pytest.raises(PrototxtError, match=r"'layer \{ name: ! \}': Expected"):  # short: as is
        ptx.parse_text_proto("layer { name: ! }", pb.NetParameter)
