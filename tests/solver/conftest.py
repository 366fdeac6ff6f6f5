"""A tiny trainable setup in tmp_path (the working directory, as Caffe resolves names):
8 rows of HDF5 data, a two-layer classifier with a TEST-phase accuracy, and a helper writing
solver files."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

NET = """
name: "tiny"
layer { name: "data" type: "HDF5Data" top: "data" top: "label"
        hdf5_data_param { source: "list.txt" batch_size: BATCH } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip2" bottom: "label" top: "accuracy"
        include { phase: TEST } }
"""


class Setup:
    def __init__(self, root: Path) -> None:
        self.root = root
        rng = np.random.default_rng(0)
        with h5py.File(root / "data.h5", "w") as f:
            f.create_dataset("data", data=rng.standard_normal((8, 5)).astype(np.float32))
            f.create_dataset("label", data=rng.integers(0, 3, 8).astype(np.float32))
        (root / "list.txt").write_text("data.h5\n")
        self.net(4)

    def net(self, batch: int, name: str = "train.prototxt") -> Path:
        path = self.root / name
        path.write_text(NET.replace("BATCH", str(batch)))
        return path

    def solver(
        self, body: str, name: str = "solver.prototxt", net: str = "train.prototxt", seed: int = 7
    ) -> str:
        text = f'net: "{net}"\nrandom_seed: {seed}\nsnapshot_after_train: false\n{body}\n'
        (self.root / name).write_text(text)
        return name


@pytest.fixture
def setup(tmp_path, monkeypatch) -> Setup:
    monkeypatch.chdir(tmp_path)
    return Setup(tmp_path)
