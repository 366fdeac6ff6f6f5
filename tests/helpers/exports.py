"""A torch exporter that fails as torch 2.11 and 2.12 did: its trace registered a global
buffer-registration hook, then failed, and the hook stayed (see ``net.export``'s
``registration_hooks_kept``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch


def _failing_export(*args, **kwargs):
    torch.nn.modules.module.register_module_buffer_registration_hook(lambda m, n, b: b)
    raise RuntimeError("could not guard on a data-dependent expression")


@contextlib.contextmanager
def leaking_failed_export(monkeypatch: pytest.MonkeyPatch, module: object) -> Iterator[None]:
    """Within: ``module.export`` (``torch.export`` or ``torch.onnx``) registers a hook and
    fails. On the way out, no hook registered within may be left."""
    hooks = torch.nn.modules.module._global_buffer_registration_hooks
    before = dict(hooks)
    monkeypatch.setattr(module, "export", _failing_export)
    yield
    assert dict(hooks) == before
