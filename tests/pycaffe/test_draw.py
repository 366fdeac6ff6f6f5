"""caffe.draw and ``torchcaffe draw_net`` on a real model (LeNet's train/test prototxt)."""

from __future__ import annotations

import inspect
import shutil
import sys

import pytest

import torchcaffe as caffe
from torchcaffe.cli.__main__ import main as cli_main
from torchcaffe.errors import LayerParamError, UnsupportedError
from torchcaffe.formats.prototxt import read_net
from torchcaffe.proto import caffe_pb2

NET = """
name: "small"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 1 dim: 3 dim: 8 dim: 8 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "drop" type: "Dropout" bottom: "pool1" top: "pool1" include { phase: TRAIN } }
"""

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz `dot` not installed")


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.prototxt"
    path.write_text(NET)
    return read_net(str(path))


def test_graph_has_layers_blobs_and_geometry(small):
    pytest.importorskip("pydot")
    graph = caffe.draw.get_pydot_graph(small, "LR", phase=caffe.TEST)
    text = graph.to_string()
    assert "conv1" in text and "(Convolution)" in text and "stride: 2" in text and "pad: 1" in text
    assert "(Pooling AVE)" in text and "drop" not in text  # Dropout is TRAIN only
    all_phases = caffe.draw.get_pydot_graph(small, "LR").to_string()
    assert "(Dropout)" in all_phases


def test_module_styles_have_pycaffes_names_and_are_used(small, monkeypatch):
    """pycaffe's draw.py styles are LAYER_STYLE_DEFAULT, NEURON_LAYER_STYLE, BLOB_STYLE."""
    pytest.importorskip("pydot")
    monkeypatch.setitem(caffe.draw.LAYER_STYLE_DEFAULT, "shape", "box")
    graph = caffe.draw.get_pydot_graph(small, "LR", phase=caffe.TEST)
    names = {n.get_name().strip('"'): n for n in graph.get_nodes()}
    shapes = {k.split("_")[0]: n.get("shape") for k, n in names.items() if "_blob" not in k}
    assert shapes["conv1"] == "box" and shapes["relu1"] == "record"
    assert caffe.draw.BLOB_STYLE["shape"] == "octagon"


def test_graph_colors_and_edge_labels_follow_pycaffe(small):
    """Boxes colored by type (conv red, pooling orange); a layer's top edges carry its
    num_output; bottom edges carry no label."""
    pytest.importorskip("pydot")
    graph = caffe.draw.get_pydot_graph(small, "LR", phase=caffe.TEST)
    nodes = {n.get_name().strip('"'): n for n in graph.get_nodes()}
    colors = {
        name.split("_")[0]: n.get("fillcolor")
        for name, n in nodes.items()
        if not name.endswith("_blob")
    }
    assert colors["conv1"].strip('"') == "#FF5050" and colors["pool1"].strip('"') == "#FF9900"
    edges = {(e.get_source(), e.get_destination()): e.get("label") for e in graph.get_edges()}
    conv = next(name for name in nodes if name.startswith("conv1_"))
    assert str(edges[(conv, "conv1_blob")]).strip('"') == "4"
    assert edges[("data_blob", conv)] is None


@needs_dot
def test_draw_net_png_and_svg(small, tmp_path):
    pytest.importorskip("pydot")
    png = caffe.draw.draw_net(small, "TB", "png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    out = tmp_path / "small.svg"
    caffe.draw.draw_net_to_file(small, str(out), "LR")
    assert "<svg" in out.read_text() and "pool1" in out.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.prototxt", "small.svg"]


@needs_dot
def test_cli_draw_net_real_model(models_root, tmp_path, capsys):
    pytest.importorskip("pydot")
    out = tmp_path / "lenet.png"
    model = models_root / "lenet_mnist" / "lenet_train_test.prototxt"
    assert cli_main(["draw_net", str(model), str(out), "--phase", "TRAIN"]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert "drew" in capsys.readouterr().out


def test_missing_pydot_names_the_extra(small, monkeypatch):
    monkeypatch.setitem(sys.modules, "pydot", None)
    with pytest.raises(ImportError, match=r"torchcaffe\[draw\]"):
        caffe.draw.get_pydot_graph(small, "LR")


def test_missing_dot_says_how_to_install(small, monkeypatch):
    monkeypatch.setattr(caffe.draw.shutil, "which", lambda name: None)
    with pytest.raises(UnsupportedError, match="apt-get install graphviz"):
        caffe.draw.draw_net(small, "LR")


LRM_NET = """
name: "lrm"
layer { name: "data" type: "Data" top: "data" top: "label" data_param { batch_size: 64 } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        param { lr_mult: 1 } param { lr_mult: 2 }
        convolution_param { num_output: 4 kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "frozen" type: "Convolution" bottom: "conv1" top: "frozen"
        param { lr_mult: 0 } param { lr_mult: 0 }
        convolution_param { num_output: 4 kernel_size: 1 } }
layer { name: "ip1" type: "InnerProduct" bottom: "frozen" top: "ip1"
        inner_product_param { num_output: 10 } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" param { lr_mult: 0.5 }
        inner_product_param { num_output: 2 } }
layer { name: "relu" type: "ReLU" bottom: "ip2" top: "ip2" }
"""


@pytest.fixture
def lrm(tmp_path):
    path = tmp_path / "lrm.prototxt"
    path.write_text(LRM_NET)
    return read_net(str(path))


def _layer(net, name):
    return next(lp for lp in net.layer if lp.name == name)


def test_signatures_follow_pycaffe():
    def params(fn):
        return list(inspect.signature(fn).parameters)

    draw = caffe.draw
    assert params(draw.draw_net_to_file) == [
        "caffe_net",
        "filename",
        "rankdir",
        "phase",
        "display_lrm",
    ]
    assert params(draw.draw_net) == ["caffe_net", "rankdir", "ext", "phase", "display_lrm"]
    assert params(draw.get_pydot_graph) == [
        "caffe_net",
        "rankdir",
        "label_edges",
        "phase",
        "display_lrm",
    ]
    assert params(draw.get_layer_label) == ["layer", "rankdir", "display_lrm"]
    assert params(draw.get_edge_label) == ["layer"]
    assert params(draw.get_layer_lr_mult) == ["layer"]
    assert params(draw.choose_color_by_layertype) == ["layertype"]
    assert params(draw.get_pooling_types_dict) == []


def test_layer_label_shows_lr_mults_with_display_lrm(lrm):
    conv1 = _layer(lrm, "conv1")
    assert caffe.draw.get_layer_label(conv1, "TB", display_lrm=True) == (
        '"conv1 (Convolution) kernel size: 3 stride: 2 pad: 1 lr mult: 1.0, 2.0"'
    )
    assert "lr mult" not in caffe.draw.get_layer_label(conv1, "TB")
    ip1, ip2, relu = (_layer(lrm, n) for n in ("ip1", "ip2", "relu"))
    assert (
        caffe.draw.get_layer_label(ip1, "LR", True) == '"ip1\\n(InnerProduct)\\nlr mult: 1.0, 1.0"'
    )
    assert caffe.draw.get_layer_label(ip2, "LR", True).endswith('lr mult: 0.5, 1.0"')
    assert "lr mult" not in caffe.draw.get_layer_label(_layer(lrm, "frozen"), "LR", True)
    assert "lr mult" not in caffe.draw.get_layer_label(relu, "LR", True)


def test_pydot_graph_display_lrm(lrm):
    pytest.importorskip("pydot")
    text = caffe.draw.get_pydot_graph(lrm, "LR", display_lrm=True).to_string()
    assert "lr mult: 1.0, 2.0" in text and "lr mult: 0.5, 1.0" in text
    assert "lr mult" not in caffe.draw.get_pydot_graph(lrm, "LR").to_string()


def test_draw_net_to_file_takes_display_lrm_fifth_as_draw_net_py(lrm, tmp_path, monkeypatch):
    pydot = pytest.importorskip("pydot")
    # no graphviz needed: the "picture" is the dot text the graph would be rendered from
    monkeypatch.setattr(caffe.draw.shutil, "which", lambda name: "/usr/bin/dot")
    monkeypatch.setattr(pydot.Dot, "create", lambda self, format: self.to_string().encode())
    out = tmp_path / "lrm.dot"
    caffe.draw.draw_net_to_file(lrm, str(out), "LR", None, True)  # python/draw_net.py's call
    assert "lr mult: 1.0, 2.0" in out.read_text()
    caffe.draw.draw_net_to_file(lrm, str(out), "LR", caffe.TRAIN)
    assert "lr mult" not in out.read_text()


def test_pycaffe_draw_helpers(lrm):
    assert caffe.draw.get_pooling_types_dict() == {0: "MAX", 1: "AVE", 2: "STOCHASTIC"}
    labels = {lp.name: caffe.draw.get_edge_label(lp) for lp in lrm.layer}
    assert labels == {
        "data": "Batch 64",
        "conv1": "4",
        "frozen": "4",
        "ip1": "10",
        "ip2": "2",
        "relu": '""',
    }
    mults = {n: caffe.draw.get_layer_lr_mult(_layer(lrm, n)) for n in ("conv1", "frozen", "ip1")}
    assert mults == {"conv1": (1.0, 2.0), "frozen": (0.0, 0.0), "ip1": (1.0, 1.0)}
    assert caffe.draw.get_layer_lr_mult(_layer(lrm, "ip2")) == (0.5, 1.0)
    colors = [
        caffe.draw.choose_color_by_layertype(t)
        for t in ("Convolution", "Deconvolution", "Pooling", "InnerProduct", "ReLU")
    ]
    assert colors == ["#FF5050", "#FF5050", "#FF9900", "#CC33FF", "#6495ED"]


def test_lr_mult_of_a_layer_without_one_is_a_layer_param_error(lrm):
    with pytest.raises(LayerParamError, match="relu"):
        caffe.draw.get_layer_lr_mult(_layer(lrm, "relu"))
    conv = caffe_pb2.LayerParameter(name="c", type="Convolution")
    conv.param.add(lr_mult=1)
    conv.param.add(lr_mult=1)
    conv.param.add(lr_mult=1)
    with pytest.raises(LayerParamError, match="at most 2"):
        caffe.draw.get_layer_lr_mult(conv)
    with pytest.raises(LayerParamError):
        caffe.draw.get_layer_label(conv, "LR", display_lrm=True)


def test_lr_mult_errors_are_value_errors_as_pycaffes(lrm):
    """pycaffe's draw raises ValueError for a layer without multipliers or three specs."""
    with pytest.raises(ValueError, match="learning rate multiplier"):
        caffe.draw.get_layer_lr_mult(_layer(lrm, "relu"))
    conv = caffe_pb2.LayerParameter(name="c", type="InnerProduct")
    for _ in range(3):
        conv.param.add(lr_mult=1)
    with pytest.raises(ValueError, match="learning rate multiplier"):
        caffe.draw.get_layer_lr_mult(conv)


def test_cli_draw_net_takes_display_lrm_and_refuses_a_format_dot_lacks(
    lrm, tmp_path, monkeypatch, capsys
):
    """draw_net.py's --display_lrm; an extension dot cannot write is one error line (pydot's
    own report is an AssertionError traceback)."""
    pydot = pytest.importorskip("pydot")
    monkeypatch.setattr(caffe.draw.shutil, "which", lambda name: "/usr/bin/dot")

    def create(self, format):
        if format == "xyz":
            raise AssertionError("\"dot\" with args ['-Txyz'] returned code: 1")
        return self.to_string().encode()

    monkeypatch.setattr(pydot.Dot, "create", create)
    proto = tmp_path / "lrm.prototxt"
    proto.write_text(str(lrm))
    out = tmp_path / "lrm.dot"
    assert cli_main(["draw_net", str(proto), str(out), "--display_lrm"]) == 0
    assert "lr mult: 1.0, 2.0" in out.read_text()
    assert cli_main(["draw_net", str(proto), str(tmp_path / "x.xyz")]) == 2
    err = capsys.readouterr().err
    assert "dot cannot write a 'xyz' file" in err and "Traceback" not in err
    assert not (tmp_path / "x.xyz").exists()


PHASE_NET = """
name: "phases"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 } } }
layer { name: "val" type: "ReLU" bottom: "data" top: "val"
        include { phase: TEST stage: "val" } }
layer { name: "deploy" type: "TanH" bottom: "data" top: "deploy" include { stage: "deploy" } }
layer { name: "notx" type: "Sigmoid" bottom: "data" top: "notx" exclude { stage: "x" } }
layer { name: "lvl" type: "AbsVal" bottom: "data" top: "lvl" include { phase: TRAIN min_level: 2 } }
"""


def test_phase_filter_reads_only_the_rules_phase_as_draw_py(tmp_path):
    """pycaffe's draw.py ignores stages and levels and reads an unset rule phase as TRAIN."""
    pytest.importorskip("pydot")
    path = tmp_path / "phases.prototxt"
    path.write_text(PHASE_NET)
    net = read_net(str(path))

    def drawn(phase):
        text = caffe.draw.get_pydot_graph(net, "LR", phase=phase).to_string()
        return {lp.name for lp in net.layer if f"{lp.name}_{lp.type}_" in text}

    assert drawn(caffe.TRAIN) == {"data", "deploy", "lvl"}
    assert drawn(caffe.TEST) == {"data", "val", "notx"}
    both = caffe_pb2.LayerParameter(name="both", type="ReLU")
    both.include.add(phase=caffe.TRAIN)
    both.exclude.add(phase=caffe.TEST)
    net.layer.append(both)
    with pytest.raises(ValueError, match="both"):
        caffe.draw.get_pydot_graph(net, "LR", phase=caffe.TEST)
    assert "both_ReLU" in caffe.draw.get_pydot_graph(net, "LR").to_string()


def test_layer_label_is_double_quoted_as_pycaffes():
    """pycaffe's get_layer_label wraps the label in double quotes; the graph's box text is
    the same either way."""
    relu = caffe_pb2.LayerParameter(name="r", type="ReLU")
    assert caffe.draw.get_layer_label(relu, "LR") == '"r\\n(ReLU)"'
    assert caffe.draw.get_layer_label(relu, "TB") == '"r (ReLU)"'


def test_layer_label_geometry_reads_only_kernel_size_stride_pad_as_draw_py():
    """draw.py labels kernel_size[0]/stride[0]/pad[0] (else 1, 1, 0) and the pooling's
    kernel_size/stride/pad fields; the _h/_w forms do not show."""
    conv = caffe_pb2.LayerParameter(name="c", type="Convolution")
    cp = conv.convolution_param
    cp.num_output, cp.kernel_h, cp.kernel_w, cp.stride_h, cp.stride_w = 4, 7, 1, 2, 2
    cp.pad_h, cp.pad_w = 3, 0
    assert caffe.draw.get_layer_label(conv, "TB") == (
        '"c (Convolution) kernel size: 1 stride: 1 pad: 0"'
    )
    pool = caffe_pb2.LayerParameter(name="p", type="Pooling")
    pp = pool.pooling_param
    pp.kernel_h, pp.kernel_w, pp.stride_h, pp.stride_w, pp.pad_h = 3, 1, 2, 1, 1
    assert caffe.draw.get_layer_label(pool, "LR") == (
        '"p\\n(Pooling MAX)\\nkernel size: 0\\nstride: 1\\npad: 0"'
    )
    conv.convolution_param.kernel_size.extend([5, 3])
    conv.convolution_param.pad.append(2)
    assert "kernel size: 5 stride: 1 pad: 2" in caffe.draw.get_layer_label(conv, "BT")


def test_blob_nodes_take_place_of_first_and_style_of_last_mention_as_pycaffe(small):
    """pycaffe's draw keeps one ordered node table: a blob node sits where it is first met
    (right after the layer that meets it) and is an octagon only when a bottom is its last
    mention; the net's outputs and an in-place layer's unread blob are plain nodes."""
    pytest.importorskip("pydot")
    graph = caffe.draw.get_pydot_graph(small, "LR")
    nodes = [n.get_name() for n in graph.get_nodes()]
    assert nodes == [
        "data_Input_0",
        "data_blob",
        "conv1_Convolution_1",
        "conv1_blob",
        "relu1_ReLU_2",
        "pool1_Pooling_3",
        "pool1_blob",
        "drop_Dropout_4",
    ]
    shapes = {n.get_name(): n.get("shape") for n in graph.get_nodes()}
    assert shapes["data_blob"] == "octagon" and shapes["conv1_blob"] == "octagon"
    assert shapes["pool1_blob"] is None  # the in-place Dropout's top is its last mention
    test_graph = caffe.draw.get_pydot_graph(small, "LR", phase=caffe.TEST)
    assert {n.get_name(): n.get("shape") for n in test_graph.get_nodes()}["pool1_blob"] is None


def test_draw_net_to_file_raw_writes_the_dot_text_as_pycaffe_documents(
    small, tmp_path, monkeypatch
):
    """pycaffe's draw_net_to_file: "Use '.raw' to output raw text that you can manually feed
    to graphviz"; dot itself has no 'raw' format, and the text needs no dot program."""
    pytest.importorskip("pydot")
    monkeypatch.setattr(caffe.draw.shutil, "which", lambda name: None)
    out = tmp_path / "small.raw"
    caffe.draw.draw_net_to_file(small, str(out), "TB")
    text = out.read_text()
    assert text.startswith("digraph small {") and "rankdir=TB;" in text
    assert text == caffe.draw.get_pydot_graph(small, "TB").to_string()


def test_cli_draw_net_draws_the_file_as_written_as_draw_net_py(tmp_path):
    """draw_net.py merges the prototxt text without upgrading it: a deploy net's `input:`
    fields draw as a blob with no Input box. Legacy V1 `layers` are still upgraded (pycaffe
    draws them as an empty graph)."""
    pytest.importorskip("pydot")
    proto = tmp_path / "deploy.prototxt"
    proto.write_text(
        'name: "d" input: "data" input_shape { dim: 1 dim: 1 dim: 4 dim: 4 }\n'
        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"\n'
        "        inner_product_param { num_output: 2 } }\n"
    )
    out = tmp_path / "deploy.raw"
    assert cli_main(["draw_net", str(proto), str(out)]) == 0
    text = out.read_text()
    assert "(Input)" not in text and "data_blob" in text and "ip_InnerProduct_0" in text
    legacy = tmp_path / "v1.prototxt"
    legacy.write_text(
        'name: "v1" input: "data" input_dim: 1 input_dim: 1 input_dim: 4 input_dim: 4\n'
        'layers { name: "ip" type: INNER_PRODUCT bottom: "data" top: "ip"\n'
        "         inner_product_param { num_output: 2 } }\n"
    )
    assert cli_main(["draw_net", str(legacy), str(out)]) == 0
    assert "(InnerProduct)" in out.read_text()


def test_layer_names_with_colons_stay_separate_boxes(tmp_path):
    """dot reads an unquoted 'a:b' as node a, port b; pycaffe's layer nodes are quoted, so
    layers 'conv:1' and 'conv:2' are two boxes, not one node 'conv'."""
    pytest.importorskip("pydot")
    path = tmp_path / "colons.prototxt"
    path.write_text(
        'layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 } } }\n'
        'layer { name: "conv:1" type: "ReLU" bottom: "x" top: "y" }\n'
        'layer { name: "conv:2" type: "TanH" bottom: "y" top: "z" }\n'
    )
    text = caffe.draw.get_pydot_graph(read_net(str(path)), "LR").to_string()
    assert '\n"conv:1_ReLU_1" [label="conv:1\\n(ReLU)"' in text
    assert '\n"conv:2_TanH_2" [label="conv:2\\n(TanH)"' in text
    assert '\ny_blob -> "conv:2_TanH_2";' in text and "\nconv " not in text
