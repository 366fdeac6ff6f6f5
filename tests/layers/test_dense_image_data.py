"""DenseImageData (SegNet/ENet): image + label pairs, label raw values, paired mirror/crop."""

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
from tests.helpers.harness import make_layer
from torchcaffe.errors import DataError, LayerParamError


def pairs_folder(root: Path, n: int = 3, hw=(6, 8), seed: int = 0):
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    images, labels, lines = [], [], []
    for i in range(n):
        img = rng.integers(0, 256, (*hw, 3), dtype=np.uint8)
        lab = rng.integers(0, 11, hw, dtype=np.uint8)
        cv2.imwrite(str(root / f"im{i}.png"), img)
        cv2.imwrite(str(root / f"lab{i}.png"), lab)
        images.append(img)
        labels.append(lab)
        lines.append(f"im{i}.png lab{i}.png")
    (root / "list.txt").write_text("\n".join(lines) + "\n")
    return images, labels


_DIR = Path(tempfile.mkdtemp(prefix="torchcaffe-dense-case-"))
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)
pairs_folder(_DIR)

CASES = [
    LayerCase(
        "DenseImageData",
        f'top: "data" top: "label" dense_image_data_param {{ source: "{_DIR / "list.txt"}" '
        f'root_folder: "{_DIR}/" batch_size: 3 }}',
        bottom_shapes=(),
        n_tops=2,
        phase="TEST",
    )
]


def dense(root, extra="", transform="", phase="TEST", batch=3):
    snippet = (
        f'top: "data" top: "label" transform_param {{ {transform} }} dense_image_data_param {{ '
        f'source: "{root / "list.txt"}" root_folder: "{root}/" batch_size: {batch} {extra} }}'
    )
    return make_layer(snippet, (), type="DenseImageData", n_tops=2, phase=phase)[0]


def test_pairs_in_order_label_untransformed(tmp_path):
    images, labels = pairs_folder(tmp_path)
    layer = dense(tmp_path, transform="mean_value: 10 scale: 0.5", batch=2)
    assert layer.output_shapes([]) == [(2, 3, 6, 8), (2, 1, 6, 8)]
    for rows in ([0, 1], [2, 0]):
        data, label = layer()
        want = np.stack(
            [(images[r].transpose(2, 0, 1) - np.float32(10)) * np.float32(0.5) for r in rows]
        )
        np.testing.assert_array_equal(data.numpy(), want)
        np.testing.assert_array_equal(label.numpy()[:, 0], np.stack([labels[r] for r in rows]))


def test_resize_linear_for_images_nearest_for_labels(tmp_path):
    images, labels = pairs_folder(tmp_path, 1)
    data, label = dense(tmp_path, "new_height: 4 new_width: 5", batch=1)()
    np.testing.assert_array_equal(data.numpy()[0], cv2.resize(images[0], (5, 4)).transpose(2, 0, 1))
    np.testing.assert_array_equal(
        label.numpy()[0, 0], cv2.resize(labels[0], (5, 4), interpolation=cv2.INTER_NEAREST)
    )


def test_mirror_and_crop_move_image_and_label_together(tmp_path):
    images, labels = pairs_folder(tmp_path, 1, hw=(9, 9))
    torch.manual_seed(1)
    layer = dense(tmp_path, "mirror: true crop_height: 5 crop_width: 4", phase="TRAIN", batch=8)
    data, label = layer()
    assert data.shape == (8, 3, 5, 4) and label.shape == (8, 1, 5, 4)
    for d, y in zip(data.numpy(), label.numpy()):
        found = False
        for flip in (False, True):
            img = images[0][:, ::-1] if flip else images[0]
            lab = labels[0][:, ::-1] if flip else labels[0]
            for h in range(5):
                for w in range(6):
                    if np.array_equal(d, img[h : h + 5, w : w + 4].transpose(2, 0, 1)):
                        found = found or np.array_equal(y[0], lab[h : h + 5, w : w + 4])
        assert found


def test_errors(tmp_path):
    with pytest.raises(DataError, match="list.txt"):
        dense(tmp_path)
    pairs_folder(tmp_path)
    with pytest.raises(LayerParamError, match="transform image and label differently"):
        dense(tmp_path, transform="mirror: true")
    (tmp_path / "lab1.png").unlink()
    layer = dense(tmp_path, batch=3)
    with pytest.raises(DataError, match="lab1.png"):
        layer()
