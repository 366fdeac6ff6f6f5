"""Bad limit settings (environment or ``limits.set``) are a ConfigError naming what was wrong."""

from __future__ import annotations

import pytest

import torchcaffe
from torchcaffe.errors import ConfigError, TorchCaffeError, UsageError

TEXT = 'layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 2 } } }'


@pytest.fixture(autouse=True)
def fresh_limits():
    torchcaffe.limits.reset()
    yield
    torchcaffe.limits.reset()


@pytest.mark.parametrize(
    "raw, why",
    [
        ("abc", "is not an integer"),
        ("1.5", "is not an integer"),
        ("2e9", "is not an integer"),
        ("0", "is not positive"),
        ("-4", "is not positive"),
        ("0x0", "is not positive"),
    ],
)
def test_bad_environment_value_names_variable_value_and_expectation(monkeypatch, raw, why):
    monkeypatch.setenv("TORCHCAFFE_MAX_BLOB_ELEMENTS", raw)
    with pytest.raises(ConfigError, match="TORCHCAFFE_MAX_BLOB_ELEMENTS"):
        torchcaffe.limits.reset()  # reset re-reads the environment
    with pytest.raises(ConfigError) as info:
        torchcaffe.limits.get()
    message = str(info.value)
    assert f"TORCHCAFFE_MAX_BLOB_ELEMENTS={raw!r} {why}" in message
    assert "positive integer" in message and "max_blob_elements" in message
    assert isinstance(info.value, TorchCaffeError) and isinstance(info.value, ValueError)
    # the first load is where it surfaces, as the same error
    with pytest.raises(ConfigError, match="TORCHCAFFE_MAX_BLOB_ELEMENTS"):
        torchcaffe.load(TEXT)


@pytest.mark.parametrize("raw, value", [(" 7 ", 7), ("0x20", 32), ("1_000", 1000)])
def test_good_environment_spellings(monkeypatch, raw, value):
    monkeypatch.setenv("TORCHCAFFE_MAX_LAYERS", raw)
    torchcaffe.limits.reset()
    assert torchcaffe.limits.get().max_layers == value


def test_empty_environment_value_means_default(monkeypatch):
    monkeypatch.setenv("TORCHCAFFE_MAX_AXES", "  ")
    torchcaffe.limits.reset()
    assert torchcaffe.limits.get().max_axes == 32


@pytest.mark.parametrize("value", [0, -1, 1.5, "7", None, True, 2.0])
def test_bad_value_in_code_is_a_config_error(value):
    with pytest.raises(ConfigError) as info:
        torchcaffe.limits.set(max_axes=value)
    assert "max_axes" in str(info.value) and repr(value) in str(info.value)
    with pytest.raises(ConfigError, match="max_layers"):
        with torchcaffe.limits.override(max_layers=value):
            pass
    assert torchcaffe.limits.get().max_axes == 32  # nothing changed


def test_unknown_limit_name_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown limit") as info:
        torchcaffe.limits.set(max_things=3)
    assert "max_things" in str(info.value) and "max_axes" in str(info.value)
    assert isinstance(info.value, TypeError)
