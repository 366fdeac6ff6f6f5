"""Caffe's upgrade rules (upgrade_proto.cpp), one group of tests per rule, plus the reference data.

Expected values restate Caffe's rules (V0 field -> V1 param, enum -> type string, ...) or come
from ``golden/legacy`` (what the reference Caffe's upgrade wrote).
"""

from __future__ import annotations

import contextlib
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from torchcaffe.errors import (
    BlobWiringError,
    LayerParamError,
    PrototxtError,
    SolverError,
    UnknownLayerTypeError,
)
from torchcaffe.formats import upgrade as up
from torchcaffe.formats.binaryproto import blob_proto_to_array
from torchcaffe.formats.prototxt import (
    parse_net_text,
    parse_text_proto,
    read_net,
    read_net_binary,
    read_net_text,
)
from torchcaffe.proto import caffe_pb2 as pb

REPO = Path(__file__).resolve().parents[2]
SHARED = (REPO / ".." / "shared").resolve()
GOLDEN = REPO / "tests" / "golden" if (REPO / "tests" / "golden").is_dir() else SHARED / "golden"
LEGACY_CASES = sorted(p for p in (GOLDEN / "legacy").glob("*") if p.is_dir())
MODELS = SHARED / "models"


def net(text: str) -> pb.NetParameter:
    return parse_net_text(textwrap.dedent(text))


def v1_layer(text: str) -> pb.V1LayerParameter:
    return parse_text_proto(textwrap.dedent(text), pb.V1LayerParameter)


@contextlib.contextmanager
def no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# -- V0 padding layers ----------------------------------------------------------------------

PADDED_V0 = """
    name: "padded"
    input: "data"
    layers { layer { name: "pad1" type: "padding" pad: 2 } bottom: "data" top: "pad1" }
    layers { layer { name: "conv1" type: "conv" num_output: 4 kernelsize: 3 }
             bottom: "pad1" top: "conv1" }
    layers { layer { name: "pad2" type: "padding" pad: 1 } bottom: "conv1" top: "pad2" }
    layers { layer { name: "pool1" type: "pool" pool: MAX kernelsize: 3 stride: 2 }
             bottom: "pad2" top: "pool1" }
"""


def test_padding_folds_into_conv_and_pool_and_rewires_bottom():
    out = up.upgrade_v0_padding_layers(net(PADDED_V0))
    assert [c.layer.name for c in out.layers] == ["conv1", "pool1"]
    conv, pool = out.layers
    assert (conv.layer.pad, list(conv.bottom)) == (2, ["data"])
    assert (pool.layer.pad, list(pool.bottom)) == (1, ["conv1"])
    assert list(out.input) == ["data"] and out.name == "padded"


def test_padding_upgrade_is_idempotent():
    once = up.upgrade_v0_padding_layers(net(PADDED_V0))
    assert up.upgrade_v0_padding_layers(once) == once


def test_padding_into_non_conv_layer_raises():
    bad = net("""
        input: "data"
        layers { layer { name: "pad1" type: "padding" pad: 1 } bottom: "data" top: "pad1" }
        layers { layer { name: "relu1" type: "relu" } bottom: "pad1" top: "relu1" }
    """)
    with pytest.raises(LayerParamError, match=r"layer 'relu1' \(relu\).*'pad1'.*conv or pool"):
        up.upgrade_v0_padding_layers(bad, "n.prototxt")


def test_padding_into_conv_with_two_bottoms_raises():
    bad = net("""
        input: "a" input: "b"
        layers { layer { name: "pad1" type: "padding" pad: 1 } bottom: "a" top: "pad1" }
        layers { layer { name: "conv1" type: "conv" } bottom: "pad1" bottom: "b" top: "c" }
    """)
    with pytest.raises(BlobWiringError, match=r"layer 'conv1'.*expected 1 bottom, got 2"):
        up.upgrade_v0_padding_layers(bad)


def test_padding_layer_with_two_tops_raises():
    bad = net("""
        input: "a"
        layers { layer { name: "pad1" type: "padding" } bottom: "a" top: "p" top: "q" }
        layers { layer { name: "conv1" type: "conv" } bottom: "p" top: "c" }
    """)
    with pytest.raises(BlobWiringError, match=r"layer 'pad1' \(padding\).*expected 1 top, got 2"):
        up.upgrade_v0_padding_layers(bad)


def test_padding_upgrade_unknown_bottom_raises():
    bad = net("""
        layers { layer { name: "conv1" type: "conv" } bottom: "nowhere" top: "c" }
    """)
    with pytest.raises(BlobWiringError, match=r"n\.prototxt: layer 'conv1'.*'nowhere'"):
        up.upgrade_v0_padding_layers(bad, "n.prototxt")


# -- V0 layer types and fields --------------------------------------------------------------

# V0 type string -> the V2 type string it ends as (UpgradeV0LayerType, then UpgradeV1LayerType).
V0_TO_V2 = {
    "accuracy": "Accuracy",
    "bnll": "BNLL",
    "concat": "Concat",
    "conv": "Convolution",
    "data": "Data",
    "dropout": "Dropout",
    "euclidean_loss": "EuclideanLoss",
    "flatten": "Flatten",
    "hdf5_data": "HDF5Data",
    "hdf5_output": "HDF5Output",
    "im2col": "Im2col",
    "images": "ImageData",
    "infogain_loss": "InfogainLoss",
    "innerproduct": "InnerProduct",
    "lrn": "LRN",
    "multinomial_logistic_loss": "MultinomialLogisticLoss",
    "pool": "Pooling",
    "relu": "ReLU",
    "sigmoid": "Sigmoid",
    "softmax": "Softmax",
    "softmax_loss": "SoftmaxWithLoss",
    "split": "Split",
    "tanh": "TanH",
    "window_data": "WindowData",
}


@pytest.mark.parametrize("v0_type,v2_type", sorted(V0_TO_V2.items()))
def test_v0_layer_type_becomes_v2_type(v0_type, v2_type):
    assert up.upgrade_v1_layer_type(up.upgrade_v0_layer_type(v0_type)) == v2_type


def test_v0_unknown_layer_type_raises_with_close_match():
    with pytest.raises(UnknownLayerTypeError, match=r"layer 'c1'.*'convv'.*did you mean 'conv'"):
        up.upgrade_v0_layer_type("convv", layer="c1")


# (V0 type, V0 fields, the V1 fields Caffe's UpgradeV0LayerParameter writes for them)
V0_FIELD_CASES = [
    ("conv", "num_output: 7", "convolution_param { num_output: 7 }"),
    ("innerproduct", "num_output: 7", "inner_product_param { num_output: 7 }"),
    ("conv", "biasterm: false", "convolution_param { bias_term: false }"),
    ("innerproduct", "biasterm: false", "inner_product_param { bias_term: false }"),
    (
        "conv",
        "weight_filler { type: 'xavier' }",
        "convolution_param { weight_filler { type: 'xavier' } }",
    ),
    (
        "innerproduct",
        "weight_filler { type: 'gaussian' std: 0.5 }",
        "inner_product_param { weight_filler { type: 'gaussian' std: 0.5 } }",
    ),
    (
        "conv",
        "bias_filler { type: 'constant' value: 0.25 }",
        "convolution_param { bias_filler { type: 'constant' value: 0.25 } }",
    ),
    (
        "innerproduct",
        "bias_filler { type: 'constant' value: 0.25 }",
        "inner_product_param { bias_filler { type: 'constant' value: 0.25 } }",
    ),
    ("conv", "pad: 2", "convolution_param { pad: 2 }"),
    ("pool", "pad: 2", "pooling_param { pad: 2 }"),
    ("conv", "kernelsize: 5", "convolution_param { kernel_size: 5 }"),
    ("pool", "kernelsize: 3", "pooling_param { kernel_size: 3 }"),
    ("conv", "group: 2", "convolution_param { group: 2 }"),
    ("conv", "stride: 4", "convolution_param { stride: 4 }"),
    ("pool", "stride: 2", "pooling_param { stride: 2 }"),
    ("pool", "pool: MAX", "pooling_param { pool: MAX }"),
    ("pool", "pool: AVE", "pooling_param { pool: AVE }"),
    ("pool", "pool: STOCHASTIC", "pooling_param { pool: STOCHASTIC }"),
    ("dropout", "dropout_ratio: 0.25", "dropout_param { dropout_ratio: 0.25 }"),
    ("lrn", "local_size: 3", "lrn_param { local_size: 3 }"),
    ("lrn", "alpha: 0.5", "lrn_param { alpha: 0.5 }"),
    ("lrn", "beta: 0.75", "lrn_param { beta: 0.75 }"),
    ("lrn", "k: 2", "lrn_param { k: 2 }"),
    ("data", "source: 'db'", "data_param { source: 'db' }"),
    ("hdf5_data", "source: 'h5.txt'", "hdf5_data_param { source: 'h5.txt' }"),
    ("images", "source: 'list.txt'", "image_data_param { source: 'list.txt' }"),
    ("window_data", "source: 'win.txt'", "window_data_param { source: 'win.txt' }"),
    ("infogain_loss", "source: 'H.binaryproto'", "infogain_loss_param { source: 'H.binaryproto' }"),
    ("data", "scale: 0.5", "transform_param { scale: 0.5 }"),
    ("relu", "scale: 0.5", "transform_param { scale: 0.5 }"),
    ("data", "meanfile: 'm.binaryproto'", "transform_param { mean_file: 'm.binaryproto' }"),
    ("data", "batchsize: 16", "data_param { batch_size: 16 }"),
    ("hdf5_data", "batchsize: 16", "hdf5_data_param { batch_size: 16 }"),
    ("images", "batchsize: 16", "image_data_param { batch_size: 16 }"),
    ("window_data", "batchsize: 16", "window_data_param { batch_size: 16 }"),
    ("images", "cropsize: 11", "transform_param { crop_size: 11 }"),
    ("window_data", "mirror: true", "transform_param { mirror: true }"),
    ("data", "rand_skip: 9", "data_param { rand_skip: 9 }"),
    ("images", "rand_skip: 9", "image_data_param { rand_skip: 9 }"),
    ("images", "shuffle_images: true", "image_data_param { shuffle: true }"),
    ("images", "new_height: 32", "image_data_param { new_height: 32 }"),
    ("images", "new_width: 24", "image_data_param { new_width: 24 }"),
    ("concat", "concat_dim: 2", "concat_param { concat_dim: 2 }"),
    ("window_data", "det_fg_threshold: 0.625", "window_data_param { fg_threshold: 0.625 }"),
    ("window_data", "det_bg_threshold: 0.375", "window_data_param { bg_threshold: 0.375 }"),
    ("window_data", "det_fg_fraction: 0.25", "window_data_param { fg_fraction: 0.25 }"),
    ("window_data", "det_context_pad: 16", "window_data_param { context_pad: 16 }"),
    ("window_data", "det_crop_mode: 'square'", "window_data_param { crop_mode: 'square' }"),
    (
        "hdf5_output",
        "hdf5_output_param { file_name: 'out.h5' }",
        "hdf5_output_param { file_name: 'out.h5' }",
    ),
]


@pytest.mark.parametrize(
    "v0_type,v0_fields,v1_fields",
    V0_FIELD_CASES,
    ids=[f"{t}-{f.split(':')[0].split()[0]}" for t, f, _ in V0_FIELD_CASES],
)
def test_v0_field_maps_to_v1_param(v0_type, v0_fields, v1_fields):
    conn = v1_layer(f"layer {{ name: 'l' type: '{v0_type}' {v0_fields} }} bottom: 'a' top: 'b'")
    v1_enum = pb.V1LayerParameter.LayerType.Name(up.upgrade_v0_layer_type(v0_type))
    want = v1_layer(f"name: 'l' type: {v1_enum} bottom: 'a' top: 'b' {v1_fields}")
    with no_warnings():
        assert up.upgrade_v0_layer_parameter(conn) == want


@pytest.mark.parametrize(
    "v0_type,v0_field",
    [
        ("relu", "num_output: 3"),
        ("pool", "group: 2"),
        ("conv", "dropout_ratio: 0.5"),
        ("innerproduct", "pad: 1"),
        ("data", "new_height: 3"),
        ("softmax", "source: 'x'"),
        ("pool", "biasterm: true"),
        ("concat", "local_size: 5"),
    ],
)
def test_v0_field_on_other_layer_type_warns_and_is_dropped(v0_type, v0_field):
    conn = v1_layer(f"layer {{ name: 'l' type: '{v0_type}' {v0_field} }}")
    field = v0_field.split(":")[0]
    with pytest.warns(up.UpgradeWarning, match=rf"layer 'l' \({v0_type}\).*'{field}'"):
        out = up.upgrade_v0_layer_parameter(conn, "n.prototxt")
    v1_enum = pb.V1LayerParameter.LayerType.Name(up.upgrade_v0_layer_type(v0_type))
    assert out == v1_layer(f"name: 'l' type: {v1_enum}")


def test_v0_layer_carries_blobs_and_learning_rates():
    conn = v1_layer("""
        layer { name: 'c' type: 'conv'
                blobs { num: 1 channels: 1 height: 1 width: 2 data: 1 data: 2 }
                blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0 }
    """)
    out = up.upgrade_v0_layer_parameter(conn)
    assert list(out.blobs_lr) == [1, 2] and list(out.weight_decay) == [1, 0]
    assert list(out.blobs[0].data) == [1, 2] and out.blobs[0].width == 2


def test_v0_net_keeps_name_inputs_and_force_backward():
    out = up.upgrade_v0_net(
        net("""
        name: "n" input: "data" input_dim: 1 input_dim: 2 input_dim: 3 input_dim: 4
        force_backward: true
        layers { layer { name: "r" type: "relu" } bottom: "data" top: "data" }
    """)
    )
    assert (out.name, list(out.input), list(out.input_dim)) == ("n", ["data"], [1, 2, 3, 4])
    assert out.force_backward and out.layers[0].type == pb.V1LayerParameter.RELU


def test_v0_net_mixed_with_layer_raises():
    mixed = net("""
        layers { layer { name: "r" type: "relu" } }
        layer { name: "s" type: "Softmax" }
    """)
    with pytest.raises(PrototxtError, match="both 'layer' and 'layers'"):
        up.upgrade_net_as_needed(mixed)


def test_v0_data_layer_upgrades_to_v2_data_and_transform_params():
    out = up.upgrade_net_as_needed(
        net("""
        layers { layer { name: "d" type: "data" source: "db" batchsize: 8 scale: 0.5
                         meanfile: "m.binaryproto" cropsize: 7 mirror: true }
                 top: "data" top: "label" }
    """)
    )
    assert out == net("""
        layer { name: "d" type: "Data" top: "data" top: "label"
                data_param { source: "db" batch_size: 8 }
                transform_param { scale: 0.5 mean_file: "m.binaryproto" crop_size: 7
                                  mirror: true } }
    """)


# -- V1 -> V2 -------------------------------------------------------------------------------

# Every V1 enum and the V2 type string Caffe's UpgradeV1LayerType gives it.
V1_TO_V2 = {
    "NONE": "",
    "ABSVAL": "AbsVal",
    "ACCURACY": "Accuracy",
    "ARGMAX": "ArgMax",
    "BNLL": "BNLL",
    "CONCAT": "Concat",
    "CONTRASTIVE_LOSS": "ContrastiveLoss",
    "CONVOLUTION": "Convolution",
    "DECONVOLUTION": "Deconvolution",
    "DATA": "Data",
    "DROPOUT": "Dropout",
    "DUMMY_DATA": "DummyData",
    "EUCLIDEAN_LOSS": "EuclideanLoss",
    "ELTWISE": "Eltwise",
    "EXP": "Exp",
    "FLATTEN": "Flatten",
    "HDF5_DATA": "HDF5Data",
    "HDF5_OUTPUT": "HDF5Output",
    "HINGE_LOSS": "HingeLoss",
    "IM2COL": "Im2col",
    "IMAGE_DATA": "ImageData",
    "INFOGAIN_LOSS": "InfogainLoss",
    "INNER_PRODUCT": "InnerProduct",
    "LRN": "LRN",
    "MEMORY_DATA": "MemoryData",
    "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss",
    "MVN": "MVN",
    "POOLING": "Pooling",
    "POWER": "Power",
    "RELU": "ReLU",
    "SIGMOID": "Sigmoid",
    "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss",
    "SILENCE": "Silence",
    "SOFTMAX": "Softmax",
    "SOFTMAX_LOSS": "SoftmaxWithLoss",
    "SPLIT": "Split",
    "SLICE": "Slice",
    "TANH": "TanH",
    "WINDOW_DATA": "WindowData",
    "THRESHOLD": "Threshold",
}


def test_v1_type_table_covers_every_schema_enum():
    assert set(pb.V1LayerParameter.LayerType.keys()) == set(V1_TO_V2)


@pytest.mark.parametrize("enum_name,v2_type", sorted(V1_TO_V2.items()))
def test_v1_enum_type_becomes_v2_string(enum_name, v2_type):
    v1 = v1_layer(f"name: 'l' type: {enum_name}")
    assert up.upgrade_v1_layer_parameter(v1).type == v2_type


def test_v1_unknown_enum_value_raises():
    with pytest.raises(UnknownLayerTypeError, match="layer 'x'"):
        up.upgrade_v1_layer_type(999, layer="x")


def test_v1_blob_settings_become_param_specs():
    v1 = v1_layer("""
        name: "c" type: CONVOLUTION param: "w" param: "b"
        blob_share_mode: PERMISSIVE blob_share_mode: STRICT
        blobs_lr: 1 blobs_lr: 2 blobs_lr: 3 weight_decay: 1
    """)
    out = up.upgrade_v1_layer_parameter(v1)
    assert list(out.param) == [
        pb.ParamSpec(name="w", share_mode=pb.ParamSpec.PERMISSIVE, lr_mult=1, decay_mult=1),
        pb.ParamSpec(name="b", share_mode=pb.ParamSpec.STRICT, lr_mult=2),
        pb.ParamSpec(lr_mult=3),
    ]
    assert not out.param[1].HasField("decay_mult")


def test_v1_layer_copies_wiring_rules_loss_weight_blobs_and_typed_params():
    v1 = v1_layer("""
        name: "loss" type: SOFTMAX_LOSS bottom: "ip" bottom: "label" top: "loss"
        include { phase: TRAIN } exclude { stage: "deploy" } loss_weight: 2
        blobs { shape { dim: 2 } data: 1 data: 2 }
        softmax_param { axis: 2 } loss_param { ignore_label: 3 }
        transform_param { scale: 0.5 }
    """)
    assert up.upgrade_v1_layer_parameter(v1) == parse_text_proto(
        """
        name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss"
        include { phase: TRAIN } exclude { stage: "deploy" } loss_weight: 2
        blobs { shape { dim: 2 } data: 1 data: 2 }
        softmax_param { axis: 2 } loss_param { ignore_label: 3 }
        transform_param { scale: 0.5 }
    """,
        pb.LayerParameter,
    )


@pytest.mark.parametrize("field", up.V1_PARAM_FIELDS)
def test_v1_typed_param_is_copied(field):
    v1 = pb.V1LayerParameter(name="l")
    getattr(v1, field).SetInParent()
    out = up.upgrade_v1_layer_parameter(v1)
    assert out.HasField(field)


def test_v1_upgrade_handles_every_schema_field():
    handled = {
        "bottom",
        "top",
        "name",
        "include",
        "exclude",
        "type",
        "blobs",
        "param",
        "blob_share_mode",
        "blobs_lr",
        "weight_decay",
        "loss_weight",
        "layer",
    }
    handled |= set(up.V1_PARAM_FIELDS) | set(up.V1_FORK_PARAM_FIELDS)
    assert set(pb.V1LayerParameter.DESCRIPTOR.fields_by_name) <= handled


def test_v1_fork_bn_param_is_carried_over():
    out = up.upgrade_v1_layer_parameter(v1_layer("name: 'bn' bn_param { }"))
    assert out.HasField("bn_param")


def test_v1_layer_with_v0_block_warns():
    with pytest.warns(up.UpgradeWarning, match=r"layer 'r'.*V0 'layer"):
        out = up.upgrade_v1_layer_parameter(v1_layer("name: 'r' type: RELU layer { }"))
    assert out.type == "ReLU"


def test_v1_net_mixed_with_layer_raises():
    mixed = net("""
        layers { name: "r" type: RELU }
        layer { name: "s" type: "Softmax" }
    """)
    with pytest.raises(PrototxtError, match=r"m\.prototxt: .*both 'layer' and 'layers'"):
        up.upgrade_v1_net(mixed, "m.prototxt")


def test_v1_net_keeps_net_fields():
    out = up.upgrade_v1_net(
        net("""
        name: "n" force_backward: true state { phase: TEST }
        layers { name: "r" type: RELU bottom: "x" top: "x" }
    """)
    )
    assert (out.name, out.force_backward, out.state.phase) == ("n", True, pb.TEST)
    assert len(out.layers) == 0 and out.layer[0].type == "ReLU"


# -- V1 data transformation ----------------------------------------------------------------


@pytest.mark.parametrize(
    "enum_name,param",
    [
        ("DATA", "data_param"),
        ("IMAGE_DATA", "image_data_param"),
        ("WINDOW_DATA", "window_data_param"),
    ],
)
def test_data_transform_fields_move_to_transform_param(enum_name, param):
    old = net(f"""
        layers {{ name: "d" type: {enum_name} top: "data"
                  {param} {{ source: "s" scale: 0.5 mean_file: "m" crop_size: 5 mirror: true }} }}
    """)
    assert up.net_needs_data_upgrade(old)
    out = up.upgrade_net_data_transformation(old)
    assert out == net(f"""
        layers {{ name: "d" type: {enum_name} top: "data" {param} {{ source: "s" }}
                  transform_param {{ scale: 0.5 mean_file: "m" crop_size: 5 mirror: true }} }}
    """)
    assert not up.net_needs_data_upgrade(out)


def test_data_transform_gives_every_data_layer_a_transform_param():
    # Caffe's CONVERT_LAYER_TRANSFORM_PARAM calls mutable_transform_param() on each DATA,
    # IMAGE_DATA and WINDOW_DATA layer, so one with nothing to move gets an empty one
    old = net("""
        layers { name: "train" type: DATA top: "data" data_param { source: "a" scale: 0.5 } }
        layers { name: "test" type: DATA top: "data" data_param { source: "b" } }
        layers { name: "r" type: RELU bottom: "data" top: "data" }
    """)
    out = up.upgrade_net_as_needed(old)
    assert [layer.HasField("transform_param") for layer in out.layer] == [True, True, False]
    assert out.layer[1] == parse_text_proto(
        'name: "test" type: "Data" top: "data" transform_param {} data_param { source: "b" }',
        pb.LayerParameter,
    )


def test_data_transform_leaves_other_layer_types_alone():
    old = net('layers { name: "d" type: MEMORY_DATA memory_data_param { batch_size: 2 } }')
    assert not up.net_needs_data_upgrade(old)


# -- legacy input fields -------------------------------------------------------------------


def test_input_dim_groups_of_four_become_input_layer_first():
    out = up.upgrade_net_as_needed(
        net("""
        input: "a" input: "b"
        input_dim: 1 input_dim: 2 input_dim: 3 input_dim: 4
        input_dim: 5 input_dim: 6 input_dim: 7 input_dim: 8
        layer { name: "r" type: "ReLU" bottom: "a" top: "a" }
    """)
    )
    assert out == net("""
        layer { name: "input" type: "Input" top: "a" top: "b"
                input_param { shape { dim: 1 dim: 2 dim: 3 dim: 4 }
                              shape { dim: 5 dim: 6 dim: 7 dim: 8 } } }
        layer { name: "r" type: "ReLU" bottom: "a" top: "a" }
    """)


def test_input_shape_becomes_input_layer():
    out = up.upgrade_net_input(
        net("""
        input: "x" input_shape { dim: 2 dim: 9 }
        layer { name: "s" type: "Softmax" bottom: "x" top: "y" }
        layer { name: "t" type: "TanH" bottom: "y" top: "z" }
    """)
    )
    assert [layer.name for layer in out.layer] == ["input", "s", "t"]
    assert list(out.layer[0].input_param.shape[0].dim) == [2, 9]
    assert not (out.input or out.input_shape or out.input_dim)


def test_input_without_shape_is_just_cleared():
    old = net('input: "data" layer { name: "r" type: "ReLU" bottom: "data" top: "data" }')
    out = up.upgrade_net_input(old)
    assert out == net('layer { name: "r" type: "ReLU" bottom: "data" top: "data" }')


def test_input_with_too_few_dims_raises():
    old = net('input: "a" input: "b" input_dim: 1 input_dim: 2 input_dim: 3 input_dim: 4')
    with pytest.raises(LayerParamError, match=r"layer 'input' \(Input\).*expected 8.*got 4"):
        up.upgrade_net_input(old)


# -- BatchNorm -----------------------------------------------------------------------------


def test_batch_norm_with_three_params_gets_zero_rates():
    old = net("""
        layer { name: "bn" type: "BatchNorm" param { lr_mult: 1 name: "m" } param { lr_mult: 1 }
                param { lr_mult: 1 decay_mult: 1 } }
    """)
    assert up.net_needs_batch_norm_upgrade(old)
    out = up.upgrade_net_batch_norm(old)
    assert [(p.lr_mult, p.decay_mult) for p in out.layer[0].param] == [(0, 0)] * 3
    assert out.layer[0].param[0].name == "m"


@pytest.mark.parametrize(
    "layer",
    [
        'layer { name: "bn" type: "BatchNorm" param { lr_mult: 1 } param { lr_mult: 1 } }',
        'layer { name: "s" type: "Scale" param { lr_mult: 1 } param { } param { } }',
    ],
)
def test_batch_norm_upgrade_needs_batch_norm_with_three_params(layer):
    assert not up.net_needs_batch_norm_upgrade(net(layer))


# -- fork dialect: Pooling ceil_mode ---------------------------------------------------------


@pytest.mark.parametrize("ceil_mode,round_mode", [("true", "CEIL"), ("false", "FLOOR")])
def test_ceil_mode_maps_to_round_mode(ceil_mode, round_mode):
    old = net(f'layer {{ name: "p" type: "Pooling" pooling_param {{ ceil_mode: {ceil_mode} }} }}')
    out = up.upgrade_net_as_needed(old)
    assert out == net(
        f'layer {{ name: "p" type: "Pooling" pooling_param {{ round_mode: {round_mode} }} }}'
    )


def test_ceil_mode_agreeing_with_round_mode_is_cleared():
    old = net(
        'layer { name: "p" type: "Pooling" pooling_param { ceil_mode: false round_mode: FLOOR } }'
    )
    out = up.upgrade_fork_dialects(old)
    assert out == net('layer { name: "p" type: "Pooling" pooling_param { round_mode: FLOOR } }')


def test_ceil_mode_disagreeing_with_round_mode_raises():
    old = net(
        'layer { name: "p" type: "Pooling" pooling_param { ceil_mode: true round_mode: FLOOR } }'
    )
    with pytest.raises(LayerParamError, match=r"f\.prototxt: layer 'p' \(Pooling\).*ceil_mode"):
        up.upgrade_fork_dialects(old, "f.prototxt")


def test_pooling_without_ceil_mode_is_unchanged():
    old = net('layer { name: "p" type: "Pooling" pooling_param { pool: AVE } }')
    assert not up.net_needs_fork_dialect_upgrade(old)
    assert up.upgrade_fork_dialects(old) == old


# -- solvers -------------------------------------------------------------------------------


def solver(text: str) -> pb.SolverParameter:
    return parse_text_proto(text, pb.SolverParameter)


@pytest.mark.parametrize(
    "old,new",
    [
        ("SGD", "SGD"),
        ("NESTEROV", "Nesterov"),
        ("ADAGRAD", "AdaGrad"),
        ("RMSPROP", "RMSProp"),
        ("ADADELTA", "AdaDelta"),
        ("ADAM", "Adam"),
    ],
)
def test_solver_type_enum_becomes_type_string(old, new):
    out = up.upgrade_solver_as_needed(solver(f"base_lr: 0.5 solver_type: {old}"))
    assert out == solver(f"base_lr: 0.5 type: '{new}'")


def test_solver_type_and_type_both_set_raises():
    both = solver("solver_type: ADAM type: 'Adam'")
    with pytest.raises(SolverError, match=r"s\.prototxt: .*solver_type.*type"):
        up.upgrade_solver_as_needed(both, "s.prototxt")


def test_solver_type_already_current_warns():
    with pytest.warns(up.UpgradeWarning, match="already up to date"):
        out = up.upgrade_solver_type(solver("type: 'Adam'"))
    assert out.type == "Adam"


def test_snapshot_prefix_defaults_to_solver_path_without_extension():
    out = up.upgrade_snapshot_prefix_property(solver(""), "models/x/solver.prototxt")
    assert out.snapshot_prefix == "models/x/solver"


def test_snapshot_prefix_directory_gets_solver_stem(tmp_path):
    out = up.upgrade_snapshot_prefix_property(
        solver(f"snapshot_prefix: '{tmp_path}'"), "a/lenet_solver.prototxt"
    )
    assert out.snapshot_prefix == str(tmp_path / "lenet_solver")


def test_snapshot_prefix_that_is_not_a_directory_is_kept(tmp_path):
    prefix = str(tmp_path / "snap" / "lenet")
    out = up.upgrade_snapshot_prefix_property(
        solver(f"snapshot_prefix: '{prefix}'"), "solver.prototxt"
    )
    assert out.snapshot_prefix == prefix


# -- purity --------------------------------------------------------------------------------

V1_EVERYTHING = """
    name: "n" input: "data" input_dim: 1 input_dim: 1 input_dim: 2 input_dim: 2
    layers { name: "d" type: DATA data_param { scale: 0.5 } top: "x" }
    layers { name: "c" type: CONVOLUTION blobs_lr: 1 weight_decay: 1 bottom: "x" top: "y" }
"""


@pytest.mark.parametrize(
    "func,text",
    [
        (up.upgrade_v0_padding_layers, PADDED_V0),
        (up.upgrade_v0_net, PADDED_V0),
        (up.upgrade_net_as_needed, PADDED_V0),
        (up.upgrade_net_data_transformation, V1_EVERYTHING),
        (up.upgrade_v1_net, V1_EVERYTHING),
        (up.upgrade_net_as_needed, V1_EVERYTHING),
        (up.upgrade_net_input, V1_EVERYTHING),
        (
            up.upgrade_net_batch_norm,
            'layer { name: "b" type: "BatchNorm" param { } param { } param { } }',
        ),
        (up.upgrade_fork_dialects, 'layer { name: "p" type: "Pooling" pooling_param { pad: 1 } }'),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_upgrade_does_not_mutate_its_input(func, text):
    original = net(text)
    before = original.SerializeToString()
    out = func(original)
    assert original.SerializeToString() == before
    assert out is not original


def test_solver_upgrades_do_not_mutate_their_input():
    original = solver("solver_type: NESTEROV")
    before = original.SerializeToString()
    up.upgrade_solver_type(original)
    up.upgrade_snapshot_prefix_property(original, "s.prototxt")
    assert original.SerializeToString() == before


def test_current_net_upgrades_to_an_equal_copy_without_warnings():
    current = net('layer { name: "r" type: "ReLU" bottom: "x" top: "x" }')
    assert not up.net_needs_upgrade(current)
    with no_warnings():
        assert up.upgrade_net_as_needed(current) == current


# -- reference data: golden/legacy ---------------------------------------------------------


@pytest.mark.parametrize("case", LEGACY_CASES, ids=lambda p: p.name)
def test_golden_legacy_prototxt_upgrades_as_caffe_did(case):
    (source,) = case.glob("net_v*.prototxt")
    assert read_net(source) == read_net_text(case / "upgraded.prototxt")


@pytest.mark.parametrize("case", LEGACY_CASES, ids=lambda p: p.name)
def test_golden_legacy_caffemodel_upgrades_as_caffe_did(case):
    got = up.upgrade_net_as_needed(read_net_binary(case / "weights.caffemodel"))
    want = read_net_binary(case / "upgraded.caffemodel")
    assert [(lay.name, lay.type) for lay in got.layer] == [(w.name, w.type) for w in want.layer]
    for g, w in zip(got.layer, want.layer):
        assert len(g.blobs) == len(w.blobs) > 0
        for gb, wb in zip(g.blobs, w.blobs):
            np.testing.assert_array_equal(blob_proto_to_array(gb), blob_proto_to_array(wb))
            assert gb == wb
    assert not got.layers and not got.input


def test_golden_legacy_cases_exist():
    assert {p.name for p in LEGACY_CASES} >= {"v0_padding_net", "v1_conv_net"}, (
        f"golden legacy cases missing under {GOLDEN}"
    )


# -- real published models ------------------------------------------------------------------


def _model_files(pattern: str) -> list:
    if not MODELS.is_dir():
        return [
            pytest.param(
                None,
                marks=pytest.mark.skip(reason=f"../shared/models is absent (looked in {MODELS})"),
            )
        ]
    return [pytest.param(p, id=f"{p.parent.name}/{p.name}") for p in sorted(MODELS.glob(pattern))]


def _assert_current(out: pb.NetParameter) -> None:
    assert not out.layers and not out.input and not out.input_dim and not out.input_shape
    for layer in out.layer:
        assert isinstance(layer.type, str) and layer.type, f"layer {layer.name!r} has no type"
        assert not layer.pooling_param.HasField("ceil_mode"), layer.name


@pytest.mark.parametrize("path", _model_files("*/*.prototxt"))
def test_published_prototxt_reads_and_upgrades(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", up.UpgradeWarning)
        out = read_net(path)
    _assert_current(out)
    assert len(out.layer) > 0


@pytest.mark.parametrize("path", _model_files("*/*.caffemodel"))
def test_published_caffemodel_reads_and_upgrades_with_blobs(path):
    out = read_net(path)
    _assert_current(out)
    assert any(len(layer.blobs) for layer in out.layer)


def test_lenet_v0_text_upgrades_to_the_v1_lenet_layers():
    if not MODELS.is_dir():
        pytest.skip(f"../shared/models is absent (looked in {MODELS})")
    v0 = read_net(MODELS / "lenet_v0" / "lenet.prototxt")
    v1 = read_net(MODELS / "lenet_mnist" / "lenet.prototxt")
    assert [(lay.name, lay.type) for lay in v0.layer] == [(lay.name, lay.type) for lay in v1.layer]
