"""DatumDataset with DataLoader workers, CaffeTransform as a torch transform."""

from __future__ import annotations

import numpy as np
import torch

from tests.helpers.datasets import raw_lmdb
from torchcaffe.data import CaffeTransform, DatumDataset

ARRAYS = np.random.default_rng(3).integers(0, 256, (10, 3, 6, 6), dtype=np.uint8)


def test_dataset_in_worker_processes(tmp_path):
    db = raw_lmdb(tmp_path / "db", ARRAYS, range(10))
    ds = DatumDataset(db, transform=CaffeTransform(phase="test", crop_size=4, scale=0.5))
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2)
    batches = list(loader)
    data = torch.cat([b[0] for b in batches]).numpy()
    labels = torch.cat([b[1] for b in batches]).numpy()
    np.testing.assert_array_equal(labels, np.arange(10))
    np.testing.assert_array_equal(data, ARRAYS[:, :, 1:5, 1:5].astype(np.float32) * 0.5)


def test_plain_dataset_gives_uint8_records(tmp_path):
    db = raw_lmdb(tmp_path / "db", ARRAYS, range(10))
    data, label = DatumDataset(db)[3]
    assert data.dtype == torch.uint8 and label == 3
    np.testing.assert_array_equal(data.numpy(), ARRAYS[3])


def test_train_transform_mirrors_some_and_crops_inside():
    torch.manual_seed(0)
    t = CaffeTransform(mirror=True, crop_size=4)
    outs = [t(ARRAYS[0]).numpy() for _ in range(20)]
    windows = [
        ARRAYS[0][:, h : h + 4, w : w + 4].astype(np.float32) for h in range(3) for w in range(3)
    ]
    for o in outs:
        assert any(np.array_equal(o, x) or np.array_equal(o, x[:, :, ::-1]) for x in windows)
    assert len({o.tobytes() for o in outs}) > 1


def test_workers_fork_after_the_parent_read(tmp_path):
    """py-lmdb refuses a second open of a file in one process; a forked worker must still
    open its own environment when the parent already holds one."""
    db = raw_lmdb(tmp_path / "db", ARRAYS, range(10))
    ds = DatumDataset(db)
    assert ds[0][1] == 0  # the parent opens the database now
    ctx = torch.multiprocessing.get_context("fork")
    loader = torch.utils.data.DataLoader(
        ds, batch_size=5, num_workers=2, multiprocessing_context=ctx
    )
    labels = torch.cat([b[1] for b in loader]).tolist()
    assert labels == list(range(10))
