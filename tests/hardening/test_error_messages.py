"""Errors that were TorchCaffeErrors already but said the wrong thing or too little: each
now names what is wrong where (found by a bad-input sweep)."""

from __future__ import annotations

import numpy as np
import pytest

import torchcaffe
import torchcaffe as caffe
from torchcaffe.errors import BlobWiringError, DataError


def _source_net(tmp_path, layer_type: str, params: str) -> str:
    """A net of one data layer 'd' of ``layer_type`` (tops data and label) with ``params``."""
    path = tmp_path / "net.prototxt"
    path.write_text(f'layer {{ name: "d" type: "{layer_type}" top: "data" top: "label" {params} }}')
    return str(path)


def test_an_hdf5_group_where_a_dataset_should_be_is_called_a_group(tmp_path):
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_group("data")
        f["label"] = np.zeros(2, "f4")
    (tmp_path / "d.txt").write_text(f"{tmp_path / 'd.h5'}\n")
    source = tmp_path / "d.txt"
    proto = _source_net(
        tmp_path, "HDF5Data", f'hdf5_data_param {{ source: "{source}" batch_size: 2 }}'
    )
    with pytest.raises(DataError, match="'data' is a group, not a dataset"):
        caffe.Net(proto, caffe.TEST).forward()


def test_input_shapes_naming_some_of_a_data_layers_tops_says_which_to_add(tmp_path):
    pytest.importorskip("cv2")
    from tests.helpers.datasets import image_folder

    image_folder(tmp_path, [(4, 4)])
    params = f'source: "{tmp_path / "list.txt"}" root_folder: "{tmp_path}/images/" batch_size: 1'
    proto = _source_net(tmp_path, "ImageData", f"image_data_param {{ {params} }}")
    with pytest.raises(BlobWiringError, match=r"'d' \(ImageData\) becomes an Input only when.*"
                       r"every one of its tops: add \['label'\]"):  # fmt: skip
        torchcaffe.load(proto, input_shapes={"data": [1, 3, 4, 4]})


def test_an_image_name_holding_nul_is_a_data_error(tmp_path):
    pytest.importorskip("cv2")
    (tmp_path / "list.txt").write_bytes(b"a\x00b.png 3\n")
    params = f'source: "{tmp_path / "list.txt"}" batch_size: 1'
    proto = _source_net(tmp_path, "ImageData", f"image_data_param {{ {params} }}")
    with pytest.raises(DataError, match=r"cannot open image 'a\\x00b.png' \(a file name cannot"):
        caffe.Net(proto, caffe.TEST)


def test_a_window_file_cut_short_names_its_line(tmp_path):
    (tmp_path / "w.txt").write_text("# 0\nok.png\n3\n24\n32\n5\n1 0.9 0 0 10 10\n")
    params = f'source: "{tmp_path / "w.txt"}" batch_size: 2'
    proto = _source_net(
        tmp_path,
        "WindowData",
        f"transform_param {{ crop_size: 8 }} window_data_param {{ {params} }}",
    )
    with pytest.raises(DataError, match=r"malformed window file at line 7 .*expected '# index"):
        caffe.Net(proto, caffe.TEST)
