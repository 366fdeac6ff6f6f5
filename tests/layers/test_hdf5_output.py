"""HDF5Output: its bottoms land in the file as float32 4-D datasets, batch after batch."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import torchcaffe
from tests.helpers.cases import LayerCase
from tests.helpers.harness import make_layer
from torchcaffe.errors import DataError, LayerParamError

_DIR = Path(tempfile.mkdtemp(prefix="torchcaffe-hdf5out-case-"))
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)

CASES = [
    LayerCase(
        "HDF5Output",
        f'bottom: "data" bottom: "label" hdf5_output_param {{ file_name: "{_DIR / "o.h5"}" }}',
        bottom_shapes=((2, 3, 4, 5), (2,)),
        n_tops=0,
    )
]


def out_layer(path, shapes=((2, 3, 4, 5), (2,))):
    snippet = f'bottom: "data" bottom: "label" hdf5_output_param {{ file_name: "{path}" }}'
    return make_layer(snippet, shapes, type="HDF5Output", n_tops=0)


def test_batches_are_appended_as_4d_float(tmp_path):
    layer, (x, y) = out_layer(tmp_path / "o.h5")
    layer(x, y)
    layer(x * 2, y + 1)
    with h5py.File(tmp_path / "o.h5", "r") as f:
        assert f["data"].dtype == np.float32 and f["data"].shape == (4, 3, 4, 5)
        np.testing.assert_array_equal(f["data"][2:], (x * 2).numpy())
        np.testing.assert_array_equal(f["label"][:2, 0, 0, 0], y.numpy())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.h5"]


def test_in_a_net(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(
        'layer { name: "d" type: "DummyData" top: "x" top: "y" dummy_data_param { '
        'shape { dim: 2 dim: 3 } shape { dim: 2 } data_filler { type: "constant" value: 7 } } }'
        f' layer {{ name: "o" type: "HDF5Output" bottom: "x" bottom: "y" '
        f'hdf5_output_param {{ file_name: "{tmp_path / "feat.h5"}" }} }}'
    )
    net = torchcaffe.Net(str(path), torchcaffe.TEST)
    net.forward()
    with h5py.File(tmp_path / "feat.h5", "r") as f:
        np.testing.assert_array_equal(f["data"][()], np.full((2, 3, 1, 1), 7, np.float32))


def test_errors(tmp_path):
    with pytest.raises(DataError, match="directory does not exist"):
        out_layer(tmp_path / "no" / "o.h5")
    with pytest.raises(LayerParamError, match="same num"):
        out_layer(tmp_path / "o.h5", ((2, 3), (3,)))
    layer, _ = out_layer(tmp_path / "o.h5")
    with pytest.raises(LayerParamError, match="same num"):
        layer(torch.zeros(2, 3), torch.zeros(3))
