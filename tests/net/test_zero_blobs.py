"""Zero param blobs (no filler, or constant 0) are untouched anonymous mappings until written."""

from __future__ import annotations

import mmap
import os
import struct
import sys

import numpy as np
import pytest
import torch

import torchcaffe
from torchcaffe.ops._zero_blobs import MIN_HUGE_BYTES, MIN_MAPPED_BYTES, zero_blob

needs_pagemap = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.access("/proc/self/pagemap", os.R_OK),
    reason="reads page residency from /proc/self/pagemap (Linux)",
)


def resident_pages(t: torch.Tensor) -> int:
    """How many pages of ``t``'s memory are present in RAM (bit 63 of each pagemap entry)."""
    page = mmap.PAGESIZE
    first = t.data_ptr() // page
    last = (t.data_ptr() + t.numel() * t.element_size() - 1) // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = f.read((last - first + 1) * 8)
    return sum(e >> 63 for (e,) in struct.iter_unpack("<Q", entries))


def thp_mode() -> str | None:
    """The bracketed transparent-huge-page mode (always / madvise / never), if readable."""
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return None
    return text.split("[")[1].split("]")[0] if "[" in text else None


def smaps_field(t: torch.Tensor, field: str) -> int | None:
    """``field`` (e.g. THPeligible) of the /proc/self/smaps mapping holding ``t``'s memory."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                low, high = (int(x, 16) for x in head.split("-"))
                inside = low <= t.data_ptr() < high
            elif inside and head == field + ":":
                return int(line.split()[1])
    return None


def recycle_heap(nbytes: int) -> None:
    """Leave dirty freed heap memory that calloc would hand out again (and memset).

    Freeing a block glibc had mmap'd raises its mmap threshold above ``nbytes``; the next
    block of that size then comes from the heap, and freeing it keeps it there, dirty."""
    big = np.ones(nbytes + (1 << 20), dtype=np.uint8)
    del big
    dirty = np.ones(nbytes, dtype=np.uint8)
    del dirty


def test_zero_blob_values_and_shape():
    for shape in [(3, 5), (512, 256, 3, 3), (1,)]:
        t = zero_blob(shape)
        assert t.shape == shape and t.dtype == torch.float32
        assert not t.any()
        t.view(-1)[-1] = 2.0  # writable, and nothing aliases another blob
        assert t.sum() == 2.0


@needs_pagemap
def test_a_large_zero_blob_costs_no_page_until_written():
    shape = (1024, 2048)  # 8 MiB
    assert 4 * 1024 * 2048 >= MIN_MAPPED_BYTES
    recycle_heap(4 * 1024 * 2048)
    t = zero_blob(shape)
    assert resident_pages(t) == 0  # calloc from the recycled heap would have cleared them all
    t[0, 0] = 1.0  # one page comes in: 4 KiB, or 2 MiB where it is a huge page
    assert (
        1 <= resident_pages(t) <= MIN_HUGE_BYTES // mmap.PAGESIZE < t.numel() * 4 // mmap.PAGESIZE
    )
    assert t.sum() == 1.0


@needs_pagemap
def test_a_deploy_net_leaves_its_weights_untouched():
    net = torchcaffe.load(
        "layer { name: 'data' type: 'Input' top: 'data' "
        "input_param { shape { dim: 1 dim: 512 } } }\n"
        "layer { name: 'fc' type: 'InnerProduct' bottom: 'data' top: 'fc' "
        "inner_product_param { num_output: 4096 } }\n"
    )
    weight = net.layer("fc").weight
    assert weight.shape == (4096, 512) and not weight.any()
    recycle_heap(8 << 20)
    assert resident_pages(torchcaffe.load(net.net_param).layer("fc").weight) == 0


@needs_pagemap
def test_blobs_of_2_mib_and_more_are_advised_into_huge_pages():
    if thp_mode() in (None, "never"):
        pytest.skip("transparent huge pages are off here")
    big = zero_blob((MIN_HUGE_BYTES // 4,))
    if smaps_field(big, "THPeligible") is None:
        pytest.skip("this kernel's smaps has no THPeligible field")
    assert smaps_field(big, "THPeligible") == 1
    if thp_mode() == "madvise":  # then only the advice makes a mapping eligible
        assert smaps_field(zero_blob((MIN_HUGE_BYTES // 8,)), "THPeligible") == 0
