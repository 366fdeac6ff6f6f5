"""Data layer throughput: 256x256 encoded JPEG -> random 227 crop + mean file + random mirror.

    python benchmarks/bench_data.py [--images 256] [--batch 32] [--repeat 5] [--workers 1]

Subject: a ``Data`` layer (TRAIN, ``crop_size: 227 mirror: true mean_file``) reading an LMDB
that ``convert_imageset -encoded -encode_type=jpg`` wrote; it decodes and transforms in its one
background prefetch thread.
Baseline, same run: a plain torch ``DataLoader`` over the same LMDB (py-lmdb get, cv2.imdecode,
random crop, random flip, float32 mean subtraction, default collate) with ``--workers``
processes (default 1, the same number of background workers), and with 0 (all in the caller).
Reported: images/s medians over ``--repeat`` timed epochs (one warm-up epoch first), the range,
and the ratio Data layer / DataLoader. The machine may be shared: expect +-15% noise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import cv2  # noqa: E402

from torchcaffe.data.tools import compute_image_mean, convert_imageset  # noqa: E402
from torchcaffe.ops.data import DataLayer  # noqa: E402
from torchcaffe.proto import caffe_pb2 as pb  # noqa: E402


def build(work: Path, n: int) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    (work / "images").mkdir()
    lines = []
    base = cv2.resize(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), (256, 256))
    for i in range(n):
        noise = rng.integers(0, 40, (256, 256, 3), dtype=np.uint8)
        cv2.imwrite(str(work / "images" / f"{i}.jpg"), cv2.add(base, noise))
        lines.append(f"{i}.jpg {i % 10}")
    (work / "list.txt").write_text("\n".join(lines) + "\n")
    db = work / "lmdb"
    convert_imageset(
        str(work / "images") + "/", str(work / "list.txt"), str(db), encoded=True, encode_type="jpg"
    )
    mean = work / "mean.binaryproto"
    compute_image_mean(str(db), str(mean))
    return db, mean


_ENVS: dict = {}


class JpegLmdb(torch.utils.data.Dataset):
    """The baseline: what a torch user writes by hand for the same work."""

    def __init__(self, db: Path, mean: np.ndarray, crop: int) -> None:
        import lmdb

        self.db, self.mean, self.crop = str(db), mean, crop
        env = lmdb.open(self.db, readonly=True, lock=False)
        with env.begin() as txn:
            self.keys = [k for k, _ in txn.cursor()]
        env.close()  # py-lmdb refuses a second open of a file in a forked child

    def env(self):
        """One environment per process, opened where it is used."""
        import lmdb

        key = (os.getpid(), self.db)
        if key not in _ENVS:
            _ENVS[key] = lmdb.open(self.db, readonly=True, lock=False)
        return _ENVS[key]

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int):
        with self.env().begin() as txn:
            datum = pb.Datum.FromString(txn.get(self.keys[i]))
        img = cv2.imdecode(np.frombuffer(datum.data, np.uint8), cv2.IMREAD_UNCHANGED)
        h, w = img.shape[:2]
        y, x = np.random.randint(h - self.crop + 1), np.random.randint(w - self.crop + 1)
        chw = img[y : y + self.crop, x : x + self.crop].transpose(2, 0, 1).astype(np.float32)
        chw -= self.mean[:, y : y + self.crop, x : x + self.crop]
        if np.random.randint(2):
            chw = chw[:, :, ::-1]
        return torch.from_numpy(np.ascontiguousarray(chw)), datum.label


def time_epochs(next_batch, batches: int, repeat: int, batch: int) -> list[float]:
    for _ in range(batches):  # warm-up epoch (thread/worker start, page cache)
        next_batch()
    rates = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(batches):
            next_batch()
        rates.append(batches * batch / (time.perf_counter() - t0))
    return rates


def forever(loader):
    while True:
        yield from loader


def summary(name: str, rates: list[float]) -> float:
    med = statistics.median(rates)
    print(f"{name:<34} {med:8.1f} img/s  (range {min(rates):.1f} .. {max(rates):.1f})")
    return med


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    batches = args.images // args.batch
    with tempfile.TemporaryDirectory(prefix="bench_data_") as tmp:
        db, mean_file = build(Path(tmp), args.images)
        lp = pb.LayerParameter(name="data", type="Data", top=["data", "label"], phase=pb.TRAIN)
        lp.transform_param.crop_size = 227
        lp.transform_param.mirror = True
        lp.transform_param.mean_file = str(mean_file)
        lp.data_param.source, lp.data_param.batch_size = str(db), args.batch
        lp.data_param.backend = pb.DataParameter.LMDB
        layer = DataLayer.from_param(lp, [])
        ours = summary(
            "Data layer (1 prefetch thread)", time_epochs(layer, batches, args.repeat, args.batch)
        )
        layer.close()
        mean = compute_image_mean(str(db))[0]
        results = {}
        for workers in sorted({0, args.workers}, reverse=True):  # forks before the parent opens
            loader = torch.utils.data.DataLoader(
                JpegLmdb(db, mean, 227),
                batch_size=args.batch,
                shuffle=False,
                num_workers=workers,
                persistent_workers=workers > 0,
            )
            it = forever(loader)
            results[workers] = summary(
                f"DataLoader (num_workers={workers})",
                time_epochs(lambda it=it: next(it), batches, args.repeat, args.batch),
            )
        for workers, rate in results.items():
            print(f"ratio Data layer / DataLoader(num_workers={workers}): {ours / rate:.2f}x")
        print(f"cpu count {os.cpu_count()}, torch threads {torch.get_num_threads()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
