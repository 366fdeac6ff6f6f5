"""HDF5Data: tops by dataset name, batches running across files and wrapping, shuffle, errors.

The reference walks (file, row) pairs as Caffe's Next() does: rows of the current file in
order, then the next file, back to the first after the last.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.harness import make_layer
from torchcaffe.errors import BlobWiringError, DataError, LayerParamError

RNG = np.random.default_rng(5)


def write_h5(path: Path, **datasets: np.ndarray) -> Path:
    with h5py.File(path, "w") as f:
        for name, value in datasets.items():
            f.create_dataset(name, data=value)
    return path


def write_list(path: Path, files: list[Path]) -> Path:
    path.write_text("\n".join(str(f) for f in files) + "\n")
    return path


def two_files(folder: Path) -> tuple[Path, list[dict[str, np.ndarray]]]:
    """7 + 5 rows: float32 data (3, 4), int32 labels, float64 aux (2,)."""
    parts = []
    for name, rows in (("a", 7), ("b", 5)):
        parts.append(
            {
                "data": RNG.standard_normal((rows, 3, 4)).astype(np.float32),
                "label": RNG.integers(0, 10, rows).astype(np.int32),
                "aux": RNG.standard_normal((rows, 2)),
            }
        )
        write_h5(folder / f"{name}.h5", **parts[-1])
    return write_list(folder / "list.txt", [folder / "a.h5", folder / "b.h5"]), parts


_CASE_DIR = Path(tempfile.mkdtemp(prefix="torchcaffe-hdf5-case-"))
atexit.register(shutil.rmtree, _CASE_DIR, ignore_errors=True)
_CASE_LIST, _ = two_files(_CASE_DIR)

CASES = [
    LayerCase(
        "HDF5Data",
        f'top: "data" top: "label" hdf5_data_param {{ source: "{_CASE_LIST}" batch_size: 4 }}',
        bottom_shapes=(),
        n_tops=2,
    ),
    LayerCase(
        "HDF5Data",
        f'top: "aux" hdf5_data_param {{ source: "{_CASE_LIST}" batch_size: 9 }}',
        bottom_shapes=(),
        phase="TEST",
    ),
]


def ref_batches(parts, tops, batch_size, n_batches):
    """Caffe's Next(): row after row, file after file, wrapping to the first file."""
    order = [(f, r) for f, part in enumerate(parts) for r in range(len(part[tops[0]]))]
    flat = [order[i % len(order)] for i in range(batch_size * n_batches)]
    for b in range(n_batches):
        rows = flat[b * batch_size : (b + 1) * batch_size]
        yield {t: np.stack([parts[f][t][r] for f, r in rows]).astype(np.float32) for t in tops}


def hdf5_layer(source, batch_size, tops=("data", "label"), extra="", **kw):
    top_text = " ".join(f'top: "{t}"' for t in tops)
    snippet = (
        f'{top_text} hdf5_data_param {{ source: "{source}" batch_size: {batch_size} {extra} }}'
    )
    layer, _ = make_layer(snippet, (), type="HDF5Data", n_tops=len(tops), **kw)
    return layer


@pytest.mark.parametrize("batch_size,n_batches", [(5, 4), (4, 3), (12, 2), (13, 3), (1, 14)])
def test_forward_runs_across_files_and_wraps(tmp_path, batch_size, n_batches):
    source, parts = two_files(tmp_path)
    layer = hdf5_layer(source, batch_size, ("data", "label", "aux"))
    assert layer.output_shapes([]) == [(batch_size, 3, 4), (batch_size,), (batch_size, 2)]
    for want in ref_batches(parts, ("data", "label", "aux"), batch_size, n_batches):
        got = layer()
        for top, g in zip(("data", "label", "aux"), got):
            assert g.dtype == torch.float32
            np.testing.assert_array_equal(g.numpy(), want[top])


def test_names_are_relative_to_the_working_directory(tmp_path, monkeypatch):
    write_h5(tmp_path / "only.h5", data=np.arange(6, dtype=np.float32).reshape(3, 2))
    (tmp_path / "files.txt").write_text("  only.h5 \n\n")
    monkeypatch.chdir(tmp_path)
    layer = hdf5_layer("files.txt", 2, ("data",))
    np.testing.assert_array_equal(layer().numpy(), [[0, 1], [2, 3]])
    np.testing.assert_array_equal(layer().numpy(), [[4, 5], [0, 1]])


def test_output_shapes_do_not_consume_rows(tmp_path):
    source, parts = two_files(tmp_path)
    layer = hdf5_layer(source, 3, ("label",))
    layer.output_shapes([])
    np.testing.assert_array_equal(layer().numpy(), parts[0]["label"][:3])


def test_shuffle_visits_every_row_once_per_epoch(tmp_path):
    data = np.arange(10, dtype=np.float32)[:, None]
    write_h5(tmp_path / "a.h5", data=data[:6])
    write_h5(tmp_path / "b.h5", data=data[6:])
    source = write_list(tmp_path / "list.txt", [tmp_path / "a.h5", tmp_path / "b.h5"])
    torch.manual_seed(3)
    layer = hdf5_layer(source, 5, ("data",), extra="shuffle: true")
    epoch = np.concatenate([layer().numpy().ravel() for _ in range(2)])
    assert sorted(epoch) == list(range(10))
    torch.manual_seed(3)
    again = hdf5_layer(source, 5, ("data",), extra="shuffle: true")
    np.testing.assert_array_equal(again().numpy().ravel(), epoch[:5])


def test_double_and_device_follow_the_module(tmp_path):
    source, parts = two_files(tmp_path)
    layer = hdf5_layer(source, 2, ("aux",)).double()
    got = layer()
    assert got.dtype == torch.float64
    np.testing.assert_array_equal(got.numpy(), parts[0]["aux"][:2])
    assert "_like" not in layer.state_dict()


def test_in_a_net_the_tops_need_no_backward(tmp_path):
    import torchcaffe

    source, parts = two_files(tmp_path)
    net_text = (
        f'layer {{ name: "d" type: "HDF5Data" top: "data" top: "label" '
        f'hdf5_data_param {{ source: "{source}" batch_size: 4 }} }}'
    )
    path = tmp_path / "net.prototxt"
    path.write_text(net_text)
    net = torchcaffe.Net(str(path), torchcaffe.TRAIN)
    assert not net.module.steps[0].need_backward
    net.forward()
    np.testing.assert_array_equal(net.blobs["label"].data, parts[0]["label"][:4])


# -- errors ---------------------------------------------------------------------------------
def test_missing_source_names_the_layer_and_file(tmp_path):
    with pytest.raises(DataError, match=r"layer 'layer' \(HDF5Data\).*nope\.txt"):
        hdf5_layer(tmp_path / "nope.txt", 2)


def test_empty_source_list(tmp_path):
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(DataError, match="names no HDF5 file"):
        hdf5_layer(tmp_path / "empty.txt", 2)


def test_missing_dataset_names_file_and_top(tmp_path):
    write_h5(tmp_path / "a.h5", data=np.zeros((3, 2), np.float32))
    source = write_list(tmp_path / "list.txt", [tmp_path / "a.h5"])
    with pytest.raises(DataError, match=r"a\.h5: no dataset named 'label'"):
        hdf5_layer(source, 2)


def test_datasets_with_different_row_counts(tmp_path):
    write_h5(tmp_path / "a.h5", data=np.zeros((3, 2), np.float32), label=np.zeros(4, np.float32))
    source = write_list(tmp_path / "list.txt", [tmp_path / "a.h5"])
    with pytest.raises(DataError, match="another number of rows"):
        hdf5_layer(source, 2)


def test_later_file_with_another_row_shape(tmp_path):
    write_h5(tmp_path / "a.h5", data=np.zeros((2, 3), np.float32))
    write_h5(tmp_path / "b.h5", data=np.zeros((2, 4), np.float32))
    source = write_list(tmp_path / "list.txt", [tmp_path / "a.h5", tmp_path / "b.h5"])
    layer = hdf5_layer(source, 2, ("data",))
    with pytest.raises(DataError, match=r"b\.h5.*differ in shape"):
        layer()


def test_string_dataset_is_refused(tmp_path):
    write_h5(tmp_path / "a.h5", data=np.array([b"x", b"y"]))
    source = write_list(tmp_path / "list.txt", [tmp_path / "a.h5"])
    with pytest.raises(DataError, match="not numeric"):
        hdf5_layer(source, 1, ("data",))


def test_transform_param_is_refused(tmp_path):
    source, _ = two_files(tmp_path)
    with pytest.raises(LayerParamError, match="does not transform data"):
        make_layer(
            f'top: "data" transform_param {{ scale: 2 }} hdf5_data_param {{ source: '
            f'"{source}" batch_size: 2 }}',
            (),
            type="HDF5Data",
        )


def test_batch_size_must_be_positive(tmp_path):
    source, _ = two_files(tmp_path)
    with pytest.raises(LayerParamError, match="batch_size must be positive"):
        hdf5_layer(source, 0)


def test_takes_no_bottoms(tmp_path):
    source, _ = two_files(tmp_path)
    with pytest.raises(BlobWiringError, match="wrong number of bottom"):
        make_layer(
            f'top: "data" hdf5_data_param {{ source: "{source}" batch_size: 2 }}',
            ((2, 3),),
            type="HDF5Data",
        )
