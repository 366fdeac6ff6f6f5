"""torchcaffe's main job on real data: scikit-learn's 8x8 handwritten digits.

    python examples/digits/digits.py [--iters 500] [--finetune-iters 200] [--work DIR]

1. write the digits as PNG files + Caffe list files, then build LMDBs with torchcaffe's
   ``convert_imageset`` and a mean file with ``compute_image_mean`` (Caffe's own tools' output);
2. train the LeNet-style net of ``solver.prototxt`` with Caffe's SGD solver, reading batches
   through its ``Data`` layer (DataTransformer: mean file, scale), and report test accuracy;
3. fine-tune the same net with a torch optimizer (AdamW) on Caffe's objective;
4. save a ``.caffemodel``, reload it in a fresh ``caffe.Net`` and show the same test accuracy.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import torchcaffe
import torchcaffe as caffe
from torchcaffe.cli.__main__ import main as torchcaffe_cli

HERE = Path(__file__).resolve().parent


def write_images(work: Path) -> tuple[int, int]:
    """The 1797 digits as 8x8 grey PNGs (0..16 scaled to 0..255) + train.txt / test.txt."""
    import cv2
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    pixels = np.clip(np.rint(digits.images * (255 / 16)), 0, 255).astype(np.uint8)
    (work / "images").mkdir()
    lines = []
    for i in order:
        name = f"digit_{i:04d}.png"
        cv2.imwrite(str(work / "images" / name), pixels[i])
        lines.append(f"{name} {digits.target[i]}")
    n_test = 360
    (work / "train.txt").write_text("\n".join(lines[n_test:]) + "\n")
    (work / "test.txt").write_text("\n".join(lines[:n_test]) + "\n")
    return len(lines) - n_test, n_test


def tool(*args: str) -> None:
    """Run a torchcaffe command-line tool in-process (as `torchcaffe <args>` would)."""
    if torchcaffe_cli(list(args)) != 0:
        raise SystemExit(f"torchcaffe {' '.join(args)} failed")


def test_accuracy(net: caffe.Net, batches: int) -> float:
    """Mean of the Accuracy top over ``batches`` forward passes (Caffe's Solver::Test)."""
    return float(np.mean([net.forward()["accuracy"] for _ in range(batches)]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=500, help="Caffe SGD iterations")
    ap.add_argument("--finetune-iters", type=int, default=200, help="AdamW iterations")
    ap.add_argument("--work", type=Path, default=None, help="working directory (default: temp)")
    args = ap.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="torchcaffe_digits_"))
    work.mkdir(parents=True, exist_ok=True)
    for name in ("lenet_digits.prototxt", "solver.prototxt"):
        shutil.copy(HERE / name, work / name)
    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a LeNet on 8x8 images: one thread is fastest, even when idle,
    try:  # and intra-op threads slow it down 10x on a busy machine
        return _run(args, work, start)
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace, work: Path, start: float) -> int:
    with contextlib.chdir(work) if hasattr(contextlib, "chdir") else _chdir(work):
        # 1. the dataset, with Caffe's tools
        n_train, n_test = write_images(work)
        print(f"wrote {n_train} training and {n_test} test digits as PNGs under {work}/images")
        for split in ("train", "test"):
            tool("convert_imageset", "-gray", "images/", f"{split}.txt", f"digits_{split}_lmdb")
        tool("compute_image_mean", "digits_train_lmdb", "digits_mean.binaryproto")

        # 2. Caffe's solver, reading through the Data layers
        solver = caffe.get_solver("solver.prototxt")
        solver.param.max_iter = args.iters
        test_iter = solver.param.test_iter[0]
        t0 = time.perf_counter()
        solver.step(args.iters)
        solver.share_weights(solver.test_nets[0])
        acc_sgd = test_accuracy(solver.test_nets[0], test_iter)
        print(
            f"Caffe SGD solver: {args.iters} iterations in {time.perf_counter() - t0:.1f} s, "
            f"test accuracy {acc_sgd:.4f} ({n_test} digits)"
        )

        # 3. fine-tune the same module with a torch optimizer on Caffe's objective
        train = solver.net.module  # a torch.nn.Module; its Data layer serves the batches
        opt = torch.optim.AdamW(train.parameters(), lr=1e-3, weight_decay=1e-4)
        t0 = time.perf_counter()
        for _ in range(args.finetune_iters):
            loss = train.total_loss(train.forward_all_blobs())
            opt.zero_grad()
            loss.backward()
            opt.step()
        acc_tuned = test_accuracy(solver.test_nets[0], test_iter)
        print(
            f"AdamW fine-tuning: {args.finetune_iters} iterations in "
            f"{time.perf_counter() - t0:.1f} s, last loss {loss.item():.4f}, "
            f"test accuracy {acc_tuned:.4f}"
        )

        # 4. save, reload, same accuracy
        weights = work / "lenet_digits.caffemodel"
        torchcaffe.save_weights(train, weights)
        reloaded = caffe.Net("lenet_digits.prototxt", caffe.TEST, weights=str(weights))
        acc_reloaded = test_accuracy(reloaded, test_iter)
        print(
            f"saved {weights.name} ({weights.stat().st_size:,} bytes); reloaded in a fresh "
            f"caffe.Net: test accuracy {acc_reloaded:.4f}"
        )
    print(f"done in {time.perf_counter() - start:.1f} s (work directory {work})")
    return 0 if acc_reloaded == acc_tuned else 1


@contextlib.contextmanager
def _chdir(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


if __name__ == "__main__":
    raise SystemExit(main())
