"""Small databases and image folders for the data tests, written through our own writers."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from torchcaffe.data.datum import array_to_datum
from torchcaffe.data.db import DBWriter


def raw_lmdb(path: Path, arrays: np.ndarray, labels, backend: str = "lmdb") -> Path:
    """A DB of Datums (uint8 -> data, float -> float_data), keys %08d in order."""
    with DBWriter(path, backend) as db:
        for i, (a, y) in enumerate(zip(arrays, labels)):
            db.put(f"{i:08d}".encode(), array_to_datum(a, int(y)).SerializeToString())
    return path


def image_folder(root: Path, shapes, *, seed: int = 0, gray: bool = False, ext: str = "png"):
    """PNG images of the given (H, W) sizes + list.txt ``name label``; returns the images
    as OpenCV decodes them (HWC BGR or HW) and the labels."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    (root / "images").mkdir(exist_ok=True)
    images, labels, lines = [], [], []
    for i, (h, w) in enumerate(shapes):
        img = rng.integers(0, 256, (h, w) if gray else (h, w, 3), dtype=np.uint8)
        name = f"img_{i}.{ext}"
        assert cv2.imwrite(str(root / "images" / name), img)
        images.append(cv2.imread(str(root / "images" / name), cv2.IMREAD_UNCHANGED))
        labels.append(i % 5)
        lines.append(f"{name} {i % 5}")
    (root / "list.txt").write_text("\n".join(lines) + "\n")
    return images, labels
