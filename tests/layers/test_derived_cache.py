"""DerivedCache: a value derived from tensors, recomputed exactly when one of them changed."""

from __future__ import annotations

import torch

from torchcaffe.ops._derived import DerivedCache


def _counting(sources: list[torch.Tensor]):
    calls = []

    def compute() -> torch.Tensor:
        calls.append(1)
        return sum(t.sum() for t in sources)

    return compute, calls


def test_kept_until_a_source_is_written_in_place():
    sources = [torch.ones(3), torch.ones(2)]
    compute, calls = _counting(sources)
    cache: DerivedCache[torch.Tensor] = DerivedCache()
    assert cache.get(sources, compute).item() == 5 and cache.get(sources, compute).item() == 5
    assert len(calls) == 1
    sources[1].mul_(2)  # bumps its version
    assert cache.get(sources, compute).item() == 7 and len(calls) == 2


def test_new_storage_under_the_same_tensor_is_a_change():
    # a move to another dtype or device swaps ``.data`` (the version need not move)
    p = torch.nn.Parameter(torch.ones(4))
    compute, calls = _counting([p])
    cache: DerivedCache[torch.Tensor] = DerivedCache()
    cache.get([p], compute)
    p.data = torch.full((4,), 2.0)
    assert cache.get([p], compute).item() == 8 and len(calls) == 2


def test_a_write_hidden_from_the_version_needs_forget():
    t = torch.ones(2)
    compute, calls = _counting([t])
    cache: DerivedCache[torch.Tensor] = DerivedCache()
    cache.get([t], compute)
    t.numpy()[:] = 3  # no version bump: the documented case for ``forget``
    assert cache.get([t], compute).item() == 2
    cache.forget()
    assert cache.get([t], compute).item() == 6 and len(calls) == 2


def test_inference_tensors_are_recomputed_every_call():
    with torch.inference_mode():
        t = torch.ones(2)
    compute, calls = _counting([t])
    cache: DerivedCache[torch.Tensor] = DerivedCache()
    cache.get([t], compute)
    cache.get([t], compute)
    assert len(calls) == 2
