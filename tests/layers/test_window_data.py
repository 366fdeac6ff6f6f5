"""WindowData: fg/bg sampling counts, warp to crop_size, context padding, errors.

The references recompute window_data_layer.cpp's geometry (float32, C round) for the cases
here and warp with cv2.resize.
"""

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

RNG = np.random.default_rng(2)
IMG = RNG.integers(0, 256, (30, 40, 3), dtype=np.uint8)
FG = (3, 2, 20, 15)  # x1 y1 x2 y2, label 7
BG = (10, 12, 35, 28)


def window_folder(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(root / "a.png"), IMG)
    lines = [
        "# 0",
        "a.png",
        "3 30 40",
        "3",
        f"7 0.8 {' '.join(map(str, FG))}",
        f"4 0.1 {' '.join(map(str, BG))}",
        "5 0.4 0 0 5 5",
    ]
    (root / "windows.txt").write_text("\n".join(lines) + "\n")
    return root / "windows.txt"


_DIR = Path(tempfile.mkdtemp(prefix="torchcaffe-window-case-"))
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)
window_folder(_DIR)

CASES = [
    LayerCase(
        "WindowData",
        f'top: "data" top: "label" transform_param {{ crop_size: 8 }} window_data_param {{ '
        f'source: "{_DIR / "windows.txt"}" root_folder: "{_DIR}/" batch_size: 4 '
        f"fg_fraction: 0.5 }}",
        bottom_shapes=(),
        n_tops=2,
        deterministic=False,  # samples windows at random
    )
]


def window_layer(root, extra="", transform="crop_size: 8", batch=4):
    snippet = (
        f'top: "data" top: "label" transform_param {{ {transform} }} window_data_param {{ '
        f'source: "{root / "windows.txt"}" root_folder: "{root}/" batch_size: {batch} '
        f"fg_threshold: 0.7 bg_threshold: 0.3 {extra} }}"  # the 0.4 window is neither
    )
    return make_layer(snippet, (), type="WindowData", n_tops=2)[0]


def warp(box, crop=8):
    x1, y1, x2, y2 = box
    return cv2.resize(IMG[y1 : y2 + 1, x1 : x2 + 1], (crop, crop)).transpose(2, 0, 1)


def test_warp_mode_bg_first_then_fg(tmp_path):
    window_folder(tmp_path)
    layer = window_layer(tmp_path, "fg_fraction: 0.25 scale: 0.5", batch=4)
    data, label = layer()
    np.testing.assert_array_equal(label.numpy(), [0, 0, 0, 7])  # int(4 * 0.25) = 1 fg
    np.testing.assert_array_equal(data.numpy()[3], warp(FG).astype(np.float32) * 0.5)
    for d in data.numpy()[:3]:
        np.testing.assert_array_equal(d, warp(BG).astype(np.float32) * 0.5)


def test_mean_value_and_mirror(tmp_path):
    window_folder(tmp_path)
    torch.manual_seed(0)
    layer = window_layer(
        tmp_path,
        "fg_fraction: 1",
        "crop_size: 8 mirror: true mean_value: 1 mean_value: 2 mean_value: 3",
        batch=8,
    )
    data, _ = layer()
    want = warp(FG).astype(np.float32) - np.array([1, 2, 3], np.float32).reshape(3, 1, 1)
    mirrored = [np.array_equal(d, want[:, :, ::-1]) for d in data.numpy()]
    plain = [np.array_equal(d, want) for d in data.numpy()]
    assert all(m or p for m, p in zip(mirrored, plain)) and any(mirrored) and any(plain)


def test_context_pad_clipped_at_the_border(tmp_path):
    """FG box (3,2)-(20,15) padded by 2 of crop 8: expands past the top-left corner."""
    window_folder(tmp_path)
    data, _ = window_layer(tmp_path, "fg_fraction: 1 context_pad: 2", batch=1)()
    f = np.float32
    scale = f(8) / f(4)
    hh, hw = f(14 / 2.0), f(18 / 2.0)
    cx, cy = f(3) + hw, f(2) + hh

    def rnd(v):
        return int(np.copysign(np.floor(abs(float(v)) + 0.5), float(v)))

    x1, x2 = rnd(cx - hw * scale), rnd(cx + hw * scale)
    y1, y2 = rnd(cy - hh * scale), rnd(cy + hh * scale)
    pad_x1, pad_y1 = max(0, -x1), max(0, -y1)
    sx, sy = f(8) / f(x2 - x1 + 1), f(8) / f(y2 - y1 + 1)
    cx1, cy1 = x1 + pad_x1, y1 + pad_y1
    out_w, out_h = rnd(f(x2 - cx1 + 1) * sx), rnd(f(y2 - cy1 + 1) * sy)
    pw, ph = rnd(f(pad_x1) * sx), rnd(f(pad_y1) * sy)
    out_w, out_h = min(out_w, 8 - pw), min(out_h, 8 - ph)
    want = np.zeros((3, 8, 8), np.float32)
    patch = cv2.resize(IMG[cy1 : y2 + 1, cx1 : x2 + 1], (out_w, out_h))
    want[:, ph : ph + out_h, pw : pw + out_w] = patch.transpose(2, 0, 1)
    assert pw > 0 and ph > 0  # the canvas keeps zeros where the padding left the image
    np.testing.assert_array_equal(data.numpy()[0], want)


def test_errors(tmp_path):
    with pytest.raises(DataError, match="windows.txt"):
        window_layer(tmp_path)
    window_folder(tmp_path)
    with pytest.raises(LayerParamError, match="crop_size"):
        window_layer(tmp_path, transform="")
    (tmp_path / "windows.txt").write_text("# 0 a.png 3 30 40 1 7 0.9 0 0 5 5\n")
    with pytest.raises(DataError, match="foreground and background"):
        window_layer(tmp_path)
    (tmp_path / "windows.txt").write_text("# 0 a.png 3 30 40 2 7 0.9 0 0 5 5 1 0.0 0 0 5\n")
    with pytest.raises(DataError, match="malformed"):
        window_layer(tmp_path)


def test_shards_sample_their_own_windows(tmp_path):
    window_folder(tmp_path)
    a, b = window_layer(tmp_path, batch=8), window_layer(tmp_path, batch=8)
    a.set_shard(0, 2)
    b.set_shard(1, 2)
    assert a.loader.rng.seed != b.loader.rng.seed


def test_overlaps_are_read_as_floats_and_compared_in_float32(tmp_path):
    """Caffe reads each window's overlap into a float and compares it with the float
    thresholds: 0.30000001 is the float 0.3, so with bg_threshold 0.3 the window is neither
    background nor foreground (a double compare, numpy 1's, would make it background)."""
    from torchcaffe.ops.window_data import read_window_file

    listing = tmp_path / "windows.txt"
    listing.write_text("# 0\nimg.png\n3\n4\n8\n2\n1 0.30000001 0 0 3 3\n1 0.7 0 0 3 3\n")
    _, fg, bg = read_window_file(str(listing), "", 0.5, float(np.float32(0.3)))
    assert bg == [] and len(fg) == 1
    assert all(isinstance(w[2], np.float32) for w in fg)
