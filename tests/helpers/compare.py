"""assert_blob_close: numpy allclose with a Caffe-style message naming the blob."""

from __future__ import annotations

import numpy as np


def assert_blob_close(name: str, got, want, rtol: float, atol: float) -> None:
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        if got.size == want.size:
            got = got.reshape(want.shape)
        else:
            raise AssertionError(f"{name}: shape {got.shape} != expected {want.shape}")
    ok = np.isclose(got, want, rtol=rtol, atol=atol)
    if not ok.all():
        bad = np.argwhere(~ok)
        idx = tuple(bad[0])
        err = np.abs(got - want)
        worst = np.unravel_index(np.argmax(err - atol - rtol * np.abs(want)), want.shape)
        raise AssertionError(
            f"{name}: {len(bad)}/{want.size} elements differ (rtol={rtol}, atol={atol}); "
            f"first at {idx}: got {got[idx]!r}, expected {want[idx]!r}; worst at "
            f"{tuple(int(i) for i in worst)}: got {got[worst]!r}, expected {want[worst]!r}"
        )
