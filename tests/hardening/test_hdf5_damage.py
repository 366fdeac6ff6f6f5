"""Damaged HDF5 weights and solver states (links, unreadable data, flipped and zeroed bytes):
a WeightsError / SolverError naming the file, and a refused load changes no param."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import torchcaffe
from torchcaffe.errors import SolverError, WeightsError
from torchcaffe.formats.prototxt import read_net
from torchcaffe.solver.state import SolverSnapshot, read_solverstate, write_solverstate_hdf5

NET = """
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 4 } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 2 } }
"""
SHAPES = {"ip1": [(4, 3), (4,)], "ip2": [(2, 4), (2,)]}


def params(net):
    return [p.detach().clone() for n in ("ip1", "ip2") for p in net.layer(n).param_blobs()]


def write_weights(path, change=None):
    with h5py.File(path, "w") as f:
        for name, shapes in SHAPES.items():
            g = f.create_group(f"data/{name}")
            for j, shape in enumerate(shapes):
                g.create_dataset(str(j), data=np.full(shape, 7, np.float32))
        if change:
            change(f)
    return str(path)


def refused_unchanged(net, path, pattern):
    before = params(net)
    with pytest.raises(WeightsError, match=pattern) as info:
        torchcaffe.load_weights(net, path)
    assert str(path) in str(info.value)
    for a, b in zip(before, params(net)):
        assert torch.equal(a, b)


def relink(name, link):
    def change(f):
        del f[name]
        f[name] = link

    return change


@pytest.mark.parametrize(
    "name, link",
    [
        ("data/ip2/1", h5py.SoftLink("/nowhere")),
        ("data/ip2", h5py.SoftLink("/nowhere")),
        ("data/ip2/0", h5py.ExternalLink("missing-file.h5", "/x")),
    ],
)
def test_dangling_links_are_weights_errors(tmp_path, name, link):
    net = torchcaffe.load(read_net(NET))
    path = write_weights(tmp_path / "w.caffemodel.h5", relink(name, link))
    refused_unchanged(net, path, f"/{name} is listed but cannot be opened")


def test_unreadable_data_behind_a_good_header_changes_nothing(tmp_path):
    # ip2's values live in an external raw file that is not there: the header reads fine,
    # the values fail only when read, after ip1 was already checked
    def change(f):
        del f["data/ip2/0"]
        f["data/ip2"].create_dataset(
            "0", shape=(2, 4), dtype="f4", external=[(str(tmp_path / "gone.bin"), 0, 32)]
        )

    net = torchcaffe.load(read_net(NET))
    path = write_weights(tmp_path / "w.caffemodel.h5", change)
    refused_unchanged(net, path, r"cannot read HDF5 dataset /data/ip2/0")


def _damaged(tmp_path, data: bytes, name: str):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("where", [0, 8, 40, 96, 200, 400, 800])
def test_zeroed_and_flipped_metadata_of_weights(tmp_path, where):
    net = torchcaffe.load(read_net(NET))
    seed = (tmp_path / "seed.h5").as_posix()
    write_weights(seed)
    data = open(seed, "rb").read()
    zeroed = data[:where] + bytes(64) + data[where + 64 :]
    flipped = bytearray(data)
    for k in range(where, min(len(data), where + 64), 7):
        flipped[k] ^= 0x5A
    for i, damaged in enumerate((zeroed, bytes(flipped), data[: where + 1])):
        path = _damaged(tmp_path, damaged, f"d{i}.caffemodel.h5")
        before = params(net)
        try:
            torchcaffe.load_weights(net, path)
        except WeightsError as err:
            assert path in str(err)
            for a, b in zip(before, params(net)):
                assert torch.equal(a, b)


@pytest.mark.parametrize("where", [0, 8, 40, 96, 200, 400, 800])
def test_zeroed_and_flipped_metadata_of_solverstates(tmp_path, where):
    seed = tmp_path / "seed.solverstate.h5"
    shapes = [(4, 3), (4,)]
    write_solverstate_hdf5(seed, SolverSnapshot(3, 1, "m.h5", [np.ones(s) for s in shapes]))
    data = seed.read_bytes()
    flipped = bytearray(data)
    for k in range(where, min(len(data), where + 64), 5):
        flipped[k] ^= 0xA5
    zeroed = data[:where] + bytes(64) + data[where + 64 :]
    for i, damaged in enumerate((zeroed, bytes(flipped), data[: where + 1])):
        path = _damaged(tmp_path, damaged, f"d{i}.solverstate.h5")
        try:
            read_solverstate(path, expected_shapes=shapes)
        except SolverError as err:
            assert path in str(err)


def test_dangling_history_link_is_a_solver_error(tmp_path):
    path = tmp_path / "s.solverstate.h5"
    write_solverstate_hdf5(path, SolverSnapshot(3, 1, "m.h5", [np.ones((4, 3)), np.ones(4)]))
    with h5py.File(path, "a") as f:
        del f["history/1"]
        f["history/1"] = h5py.SoftLink("/nowhere")
    with pytest.raises(SolverError, match="/history/1 is listed but cannot be opened") as info:
        read_solverstate(path, expected_shapes=[(4, 3), (4,)])
    assert str(path) in str(info.value)
