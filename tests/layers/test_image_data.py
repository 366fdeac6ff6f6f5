"""ImageData: list lines in order, OpenCV decode (+ resize), transform, wrap, shuffle, errors."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.datasets import image_folder
from tests.helpers.harness import make_layer
from torchcaffe.errors import DataError, LayerParamError

_DIR = Path(tempfile.mkdtemp(prefix="torchcaffe-imagedata-case-"))
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)
_IMAGES, _LABELS = image_folder(_DIR, [(6, 7)] * 4)

CASES = [
    LayerCase(
        "ImageData",
        f'top: "data" top: "label" transform_param {{ scale: 0.5 }} image_data_param {{ '
        f'source: "{_DIR / "list.txt"}" root_folder: "{_DIR}/images/" batch_size: 4 }}',
        bottom_shapes=(),
        n_tops=2,
        phase="TEST",
    ),
]


def image_layer(root, batch_size, extra="", transform="", phase="TEST"):
    snippet = (
        f'top: "data" top: "label" transform_param {{ {transform} }} image_data_param {{ '
        f'source: "{root / "list.txt"}" root_folder: "{root}/images/" batch_size: {batch_size}'
        f" {extra} }}"
    )
    layer, _ = make_layer(snippet, (), type="ImageData", n_tops=2, phase=phase)
    return layer


def chw(img):
    return img[None] if img.ndim == 2 else img.transpose(2, 0, 1)


def test_lines_in_order_with_wrap(tmp_path):
    images, labels = image_folder(tmp_path, [(5, 6)] * 3)
    layer = image_layer(tmp_path, 2, transform="mean_value: 1 mean_value: 2 mean_value: 3")
    order = [0, 1, 2, 0, 1, 2]
    for b in range(3):
        data, label = layer()
        rows = order[2 * b : 2 * b + 2]
        want = np.stack([chw(images[r]).astype(np.float32) for r in rows])
        want -= np.array([1, 2, 3], np.float32).reshape(1, 3, 1, 1)
        np.testing.assert_array_equal(data.numpy(), want)
        np.testing.assert_array_equal(label.numpy(), [labels[r] for r in rows])


def test_resize_and_gray_use_opencv(tmp_path):
    image_folder(tmp_path, [(9, 11), (5, 4)])
    layer = image_layer(tmp_path, 2, "new_height: 7 new_width: 8 is_color: false")
    data, _ = layer()
    for i in range(2):
        img = cv2.imread(str(tmp_path / "images" / f"img_{i}.png"), cv2.IMREAD_GRAYSCALE)
        want = cv2.resize(img, (8, 7), interpolation=cv2.INTER_LINEAR)
        np.testing.assert_array_equal(data.numpy()[i, 0], want)


def test_batch_takes_the_shape_of_its_first_image(tmp_path):
    image_folder(tmp_path, [(5, 6), (7, 3)])
    layer = image_layer(tmp_path, 1)
    assert layer()[0].shape == (1, 3, 5, 6)
    assert layer()[0].shape == (1, 3, 7, 3)


def test_name_with_space_splits_at_the_last_space(tmp_path):
    images, _ = image_folder(tmp_path, [(4, 4)])
    (tmp_path / "images" / "img_0.png").rename(tmp_path / "images" / "my img.png")
    (tmp_path / "list.txt").write_text("my img.png 3\n")
    data, label = image_layer(tmp_path, 1)()
    assert label.item() == 3
    np.testing.assert_array_equal(data.numpy()[0], chw(images[0]))


def test_shuffle_is_seeded_and_visits_every_line(tmp_path):
    image_folder(tmp_path, [(3, 3)] * 5)
    (tmp_path / "list.txt").write_text("".join(f"img_{i}.png {i}\n" for i in range(5)))
    torch.manual_seed(4)
    a = [image_layer(tmp_path, 5, "shuffle: true", phase="TRAIN")()[1].tolist()]
    torch.manual_seed(4)
    b = [image_layer(tmp_path, 5, "shuffle: true", phase="TRAIN")()[1].tolist()]
    assert a == b and sorted(a[0]) == [0, 1, 2, 3, 4]


def test_missing_list_image_and_undecodable_image(tmp_path):
    with pytest.raises(DataError, match=r"list\.txt: layer 'layer' \(ImageData\): cannot open"):
        image_layer(tmp_path, 1)
    image_folder(tmp_path, [(3, 3)])
    (tmp_path / "list.txt").write_text("img_0.png 0\nmissing.png 1\n")
    layer = image_layer(tmp_path, 2)
    with pytest.raises(DataError, match="missing.png"):
        layer()
    (tmp_path / "images" / "img_0.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"cannot decode image .*img_0\.png"):
        image_layer(tmp_path, 1)


def test_empty_list(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "list.txt").write_text("")
    with pytest.raises(DataError, match="empty"):
        image_layer(tmp_path, 1)


def test_new_height_without_new_width(tmp_path):
    image_folder(tmp_path, [(3, 3)])
    with pytest.raises(LayerParamError, match="new_height and new_width"):
        image_layer(tmp_path, 1, "new_height: 4")


@pytest.mark.parametrize("gray", [False, True])
def test_resize_past_the_blob_limit_is_refused_before_opencv_allocates(tmp_path, gray):
    """The first image was resized (30 GB asked of OpenCV) before any top shape was known."""
    image_folder(tmp_path, [(3, 3)])
    side = 50_000 if gray else 30_000  # 2.5e9 gray values; 2.7e9 colour ones
    extra = f"new_height: {side} new_width: {side}" + (" is_color: false" if gray else "")
    with pytest.raises(LayerParamError, match=r"\(ImageData\): images resized to .*limit"):
        image_layer(tmp_path, 1, extra)


def test_every_rank_reads_the_whole_list_as_caffes_image_data_has_no_skip(tmp_path):
    """A multi-process run: ImageDataLayer (unlike Data and HDF5Data) does not skip to its
    rank's records; each rank reads every line, a shuffling one in its own order."""
    image_folder(tmp_path, [(3, 3)] * 6)
    (tmp_path / "list.txt").write_text("".join(f"img_{i}.png {i}\n" for i in range(6)))
    layer = image_layer(tmp_path, 3, "rand_skip: 1")  # a draw below 1: from the first line
    layer.set_shard(1, 3)
    assert layer()[1].tolist() + layer()[1].tolist() == [0, 1, 2, 3, 4, 5]
    torch.manual_seed(0)
    orders = []
    for rank in range(3):
        layer = image_layer(tmp_path, 6, "shuffle: true", phase="TRAIN")
        layer.set_shard(rank, 3)
        orders.append(layer()[1].tolist())
    assert all(sorted(order) == [0, 1, 2, 3, 4, 5] for order in orders)
    assert len({tuple(order) for order in orders}) == 3
