"""Layer parameters and wiring that used to fail with a bare exception (or a giant allocation)
at forward, or load silently wrong, now fail at load with a located error (issue 13, findings
5 and 6, and the limits on blob size, axes and layer count)."""

from __future__ import annotations

import pytest

import torchcaffe
from torchcaffe.errors import BlobWiringError, LayerParamError, TorchCaffeError, UsageError
from torchcaffe.formats.prototxt import read_net


def load(text: str):
    return torchcaffe.load(read_net(text))


def data(shape=(1, 3, 4, 5), name="data") -> str:
    dims = " ".join(f"dim: {d}" for d in shape)
    return (
        f'layer {{ name: "{name}" type: "Input" top: "{name}" '
        f"input_param {{ shape {{ {dims} }} }} }}\n"
    )


PRIOR = (
    data((1, 3, 4, 5))
    + data((1, 3, 32, 32), "image")
    + 'layer { name: "pb" type: "PriorBox" bottom: "data" bottom: "image" top: "pb" '
    "prior_box_param { min_size: 4 PARAMS } }"
)


@pytest.mark.parametrize(
    "params, pattern",
    [
        ("aspect_ratio: 0", r"aspect_ratio"),
        ("aspect_ratio: 0 flip: false", r"aspect_ratio"),
        ("aspect_ratio: -2", r"aspect_ratio"),
        ("aspect_ratio: inf", r"aspect_ratio"),
        ("aspect_ratio: nan", r"aspect_ratio"),
        ("max_size: inf", r"max_size"),
        ("max_size: nan", r"max_size"),
    ],
)
def test_prior_box_bad_sizes_fail_at_load(params, pattern):
    with pytest.raises(LayerParamError, match=rf"layer 'pb' \(PriorBox\).*{pattern}"):
        load(PRIOR.replace("PARAMS", params))


def test_prior_box_min_size_inf_fails_at_load():
    with pytest.raises(LayerParamError, match=r"layer 'pb'.*min_size"):
        load(PRIOR.replace("min_size: 4 PARAMS", "min_size: inf"))


def test_lrn_window_past_the_blob_limit_fails_at_load():
    text = data((2, 3, 4, 5)) + (
        'layer { name: "n" type: "LRN" bottom: "data" top: "n" '
        "lrn_param { local_size: 2147483647 } }"
    )
    with pytest.raises(LayerParamError, match=r"layer 'n' \(LRN\).*local_size"):
        load(text)


def test_roi_pooling_huge_pooled_size_fails_at_load():
    text = (
        data((1, 3, 8, 9))
        + data((2, 5), "rois")
        + 'layer { name: "roi" type: "ROIPooling" bottom: "data" bottom: "rois" top: "roi" '
        "roi_pooling_param { pooled_h: 2147483647 pooled_w: 1 } }"
    )
    with pytest.raises(LayerParamError, match=r"layer 'roi' \(ROIPooling\).*pooled_h"):
        load(text)


@pytest.mark.parametrize("label", [3, 7, 2147483647, 3000000000])
def test_detection_evaluate_background_label_out_of_range(label):
    text = (
        data((1, 1, 2, 7), "det")
        + data((1, 1, 2, 8), "gt")
        + 'layer { name: "ev" type: "DetectionEvaluate" bottom: "det" bottom: "gt" top: "ev" '
        f"detection_evaluate_param {{ num_classes: 3 background_label_id: {label} }} }}"
    )
    with pytest.raises(LayerParamError, match=r"layer 'ev'.*background_label_id"):
        load(text)


def test_detection_evaluate_background_minus_one_is_allowed():
    text = (
        data((1, 1, 2, 7), "det")
        + data((1, 1, 2, 8), "gt")
        + 'layer { name: "ev" type: "DetectionEvaluate" bottom: "det" bottom: "gt" top: "ev" '
        "detection_evaluate_param { num_classes: 3 background_label_id: 4294967295 } }"
    )
    assert load(text).blob_shapes["ev"] == (1, 1, 5, 5)


@pytest.mark.parametrize("shape", [(1, 2, 0, 3), (1, 0, 2, 3), (1, 2, 3, 0)])
def test_pad_replicate_on_an_empty_axis_fails_at_load(shape):
    text = data(shape) + (
        'layer { name: "p" type: "Pad" bottom: "data" top: "p" '
        "pad_param { pad_type: REPLICATE pad_u: 1 pad_l: 1 } }"
    )
    with pytest.raises(LayerParamError, match=r"layer 'p' \(Pad\).*REPLICATE"):
        load(text)


# -- input shapes and limits ------------------------------------------------------------------
def test_input_dim_of_2_pow_63_minus_1_is_refused():
    with pytest.raises(LayerParamError, match=r"layer 'data' \(Input\).*elements"):
        load(data((1, 2**63 - 1)))


def test_input_with_more_than_32_axes_is_refused():
    with pytest.raises(LayerParamError, match=r"layer 'data' \(Input\).*33 axes"):
        load(data((1,) * 33))


@pytest.mark.parametrize(
    "text",
    [
        data((1,) * 50_000),
        'layer { name: "data" type: "DummyData" top: "data" dummy_data_param { shape { '
        + "dim: 1 " * 50_000
        + "} } }",
        data((1, 3))
        + 'layer { name: "r" type: "Reshape" bottom: "data" top: "r" reshape_param { '
        + "shape { dim: 0 dim: -1 "
        + "dim: 1 " * 50_000
        + "} } }",
    ],
)
def test_a_shape_of_thousands_of_axes_is_refused_in_a_short_message(text):
    """A hostile file's shape is not printed whole (it made a 150 KB message)."""
    with pytest.raises(
        LayerParamError, match=r"\[1, \S+ 1, 1, \.\.\., 1, 1\] \(5000\d axes\)"
    ) as info:
        load(text)
    assert len(str(info.value)) < 400


def test_input_count_over_int_max_is_refused_as_caffe():
    with pytest.raises(LayerParamError, match="INT_MAX"):
        load(data((2, 2**30)))
    load(data((1, 2**31 - 1 - 1)))  # just under: only shapes, nothing allocated at load


def test_input_shapes_override_is_checked_too():
    with pytest.raises(LayerParamError, match="elements"):
        torchcaffe.load(read_net(data((1, 3))), input_shapes={"data": (2**40, 2**40)})


def test_a_top_past_the_limit_is_refused_at_load():
    text = data((1, 3, 4, 5)) + (
        'layer { name: "t" type: "Tile" bottom: "data" top: "t" '
        "tile_param { axis: 0 tiles: 2000000000 } }"
    )
    with pytest.raises(LayerParamError, match=r"layer 't' \(Tile\).*top 't'.*elements"):
        load(text)


def test_limits_can_be_lowered_and_restored():
    text = data((4, 5))
    with torchcaffe.limits.override(max_blob_elements=10):
        with pytest.raises(LayerParamError, match="max_blob_elements"):
            load(text)
    load(text)
    with torchcaffe.limits.override(max_layers=1):
        with pytest.raises(TorchCaffeError, match="max_layers"):
            load(text + data((1,), "second"))


def test_limits_from_the_environment(monkeypatch):
    monkeypatch.setenv("TORCHCAFFE_MAX_AXES", "2")
    torchcaffe.limits.reset()
    try:
        assert torchcaffe.limits.get().max_axes == 2
        with pytest.raises(LayerParamError, match="max_axes"):
            load(data((1, 2, 3)))
    finally:
        monkeypatch.delenv("TORCHCAFFE_MAX_AXES")
        torchcaffe.limits.reset()
    assert torchcaffe.limits.get().max_axes == 32


def test_limits_set_and_bad_values():
    before = torchcaffe.limits.get()
    try:
        assert torchcaffe.limits.set(max_layers=5).max_layers == 5
        assert torchcaffe.limits.get().max_layers == 5
    finally:
        torchcaffe.limits.reset()
    assert torchcaffe.limits.get() == before
    with pytest.raises(ValueError):
        torchcaffe.limits.set(max_axes=0)
    with pytest.raises(TypeError, match="unknown limit"):
        torchcaffe.limits.set(max_things=3)


# -- wiring (finding 6) -----------------------------------------------------------------------
def test_input_layer_naming_one_top_twice_is_refused():
    text = (
        'layer { name: "in" type: "Input" top: "data" top: "data" '
        "input_param { shape { dim: 1 dim: 3 } shape { dim: 2 dim: 5 } } }"
    )
    with pytest.raises(BlobWiringError, match=r"layer 'in'.*top blob 'data'.*multiple sources"):
        load(text)


def test_any_layer_naming_one_top_twice_is_refused():
    text = data((2, 6)) + (
        'layer { name: "s" type: "Slice" bottom: "data" top: "x" top: "x" slice_param { axis: 1 } }'
    )
    with pytest.raises(BlobWiringError, match=r"layer 's'.*top blob 'x'.*multiple sources"):
        load(text)


@pytest.mark.parametrize("num_output, kernel", [(3, 1_000_000), (2_147_483_647, 2)])
def test_param_blob_over_the_limits_is_refused_before_allocation(num_output, kernel):
    # weights of num_output x 3 x kernel x kernel: far past INT_MAX elements, refused by name
    conv = (
        'layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" '
        f"convolution_param {{ num_output: {num_output} kernel_size: {kernel} }} }}"
    )
    with pytest.raises(LayerParamError, match="param blob 'weight'.*max_blob_elements") as info:
        load(data((1, 3, 4, 5)) + conv)
    assert info.value.layer == "conv"


@pytest.mark.parametrize(
    "shape",
    [
        "shape { dim: 100000 dim: 100000 }",
        "num: 1 channels: 100000 height: 100000 width: 1",  # the legacy form
    ],
)
def test_dummy_data_top_over_the_limits_is_refused_before_allocation(shape, monkeypatch):
    """A constant filler's top was made in full before the top-size check (40 GB here)."""
    import torch

    def no_allocation(*args, **kwargs):
        raise AssertionError("allocated a DummyData top before checking its size")

    monkeypatch.setattr(torch, "full", no_allocation)
    text = f'layer {{ name: "d" type: "DummyData" top: "d" dummy_data_param {{ {shape} }} }}'
    with pytest.raises(LayerParamError, match="top shape.*max_blob_elements") as info:
        load(text)
    assert info.value.layer == "d"


@pytest.mark.parametrize("dims", [(1, "x"), 5, "1,3", (1.5, 3), (2**70, 3)])
def test_input_shapes_that_are_not_shapes_are_usage_errors(dims):
    """int() on each dim raised a bare ValueError/TypeError from inside the builder (and cut
    1.5 to 1 silently); a dim past int64 escaped from protobuf."""
    with pytest.raises(UsageError, match=r"input_shapes\['data'\]"):
        torchcaffe.load('input: "data" input_shape { dim: 1 dim: 3 }', input_shapes={"data": dims})


def test_a_python_layer_error_in_a_net_without_a_file_is_not_noted_in_none(tmp_path, monkeypatch):
    """A net built from a NetParameter (as the time tool builds one) has no file to name."""
    (tmp_path / "tc_raising_layer.py").write_text(
        "class Raises:\n"
        "    def __init__(self, param):\n"
        "        pass\n"
        "    def setup(self, bottom, top):\n"
        "        raise ValueError('bad param_str')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    text = data((1, 3)) + (
        'layer { name: "py" type: "Python" bottom: "data" top: "y" '
        'python_param { module: "tc_raising_layer" layer: "Raises" } }'
    )
    with pytest.raises(ValueError, match="bad param_str") as info:
        torchcaffe.load(read_net(text), allow_python_layers=True)
    notes = getattr(info.value, "__notes__", [])
    assert any("layer 'py'" in n for n in notes) and not any("None" in n for n in notes)
    path = tmp_path / "net.prototxt"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        torchcaffe.load(path, allow_python_layers=True)
    assert f"in {path}" in info.value.__notes__
