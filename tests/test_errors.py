"""One error tree: every error class torchcaffe raises on bad input lives in errors.py."""

from __future__ import annotations

import inspect

import pytest
import torch

import torchcaffe
from torchcaffe import errors
from torchcaffe.blob import Blob
from torchcaffe.errors import (
    BlobShapeError,
    LayerParamError,
    RegistryError,
    TorchCaffeError,
    UnknownNameError,
    UsageError,
    WireError,
)
from torchcaffe.formats import wire
from torchcaffe.formats.prototxt import read_net
from torchcaffe.ops import _bbox, _loss_normalization
from torchcaffe.registry import register_layer

NET = """
name: "tiny"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "relu" type: "ReLU" bottom: "data" top: "out" }
"""


def test_every_error_class_is_defined_in_errors_and_rooted_at_torchcaffe_error():
    classes = [
        c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, Exception)
    ]
    assert {c.__name__ for c in classes} >= {
        "BlobShapeError",
        "RegistryError",
        "UnknownNameError",
        "UsageError",
        "WireError",
    }
    for cls in classes:
        assert cls.__module__ == "torchcaffe.errors"
        if not issubclass(cls, Warning):  # warnings are reported, not raised
            assert issubclass(cls, TorchCaffeError), cls


def test_unknown_layer_name_is_a_lookup_error_not_a_param_error():
    net = torchcaffe.load(read_net(NET), phase="test")
    with pytest.raises(UnknownNameError, match=r"no layer named 'rleu'.*close matches.*relu") as e:
        net.layer("rleu")
    assert isinstance(e.value, KeyError)
    assert not isinstance(e.value, LayerParamError)
    assert str(e.value).startswith("no layer named")  # not KeyError's quoted repr


def test_wrong_python_call_is_a_usage_error_and_a_type_error():
    with pytest.raises(UsageError, match="read_net takes a path") as e:
        read_net(42)  # type: ignore[arg-type]
    assert isinstance(e.value, TypeError)


def test_blob_shape_error_is_a_layer_param_error():
    with pytest.raises(BlobShapeError, match="negative") as e:
        Blob([2, -1])
    assert isinstance(e.value, LayerParamError)


def test_malformed_wire_bytes_raise_wire_error():
    with pytest.raises(WireError, match="truncated varint"):
        list(wire.iter_fields(memoryview(b"\x08\x80")))


def test_duplicate_registration_raises_registry_error():
    with pytest.raises(RegistryError, match="'ReLU' registered by both"):

        @register_layer("ReLU")
        class Again:  # pragma: no cover - never registered
            pass


def test_unknown_modes_in_loss_and_bbox_helpers_are_layer_param_errors():
    x = torch.zeros(1)
    with pytest.raises(LayerParamError, match="normalization mode; expected FULL"):
        _loss_normalization.normalizer(99, 1, 1, None, x)
    box = torch.zeros(1, 4)
    with pytest.raises(LayerParamError, match="code_type; expected CORNER"):
        _bbox.encode(box, box, box, 99, False)
    with pytest.raises(LayerParamError, match="code_type; expected CORNER"):
        _bbox.decode(box, box, box, 99, False)


def test_a_message_ending_in_a_period_gets_no_second_one_before_the_hint():
    from torchcaffe.errors import LayerParamError

    assert str(LayerParamError("bad field.", hint="see x")) == "bad field. see x"
    assert str(LayerParamError("bad field", hint="see x")) == "bad field. see x"
    assert str(LayerParamError("bad", expected=1, got=2, hint="h")) == "bad; expected 1, got 2. h"


def test_a_side_not_given_is_left_out_not_printed_as_none():
    """``expected`` alone (nothing was found) read "..., got None", as if None had been."""
    assert str(errors.DataError("no db", expected="data.mdb")) == "no db; expected data.mdb"
    assert str(errors.DataError("bad", got=3)) == "bad; got 3"
    assert str(errors.DataError("bad", expected=0, got=0)) == "bad; expected 0, got 0"
