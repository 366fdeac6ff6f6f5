"""CaffeFunction: the torch.func-form autograd.Functions skip torch's per-call binding of their
arguments to ``forward``'s signature (30 us of host time a call), except under a transform."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import torch

import torchcaffe
from torchcaffe.ops._functional.clamped_log import log_softmax_clamped
from torchcaffe.ops._functional.eltwise import caffe_eltwise_in_place
from torchcaffe.ops._functional.function import CaffeFunction


def _functions_in_torchcaffe() -> list[type]:
    for info in pkgutil.walk_packages(torchcaffe.__path__, "torchcaffe."):
        importlib.import_module(info.name)
    found, todo = [], [torch.autograd.Function]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("torchcaffe."):
                found.append(sub)
    return found


def test_every_torch_func_form_function_is_a_caffe_function():
    """A Function with ``setup_context`` pays torch's binding on each call unless it is one."""
    funcs = [f for f in _functions_in_torchcaffe() if "setup_context" in vars(f)]
    assert len(funcs) >= 15
    assert [f.__name__ for f in funcs if not issubclass(f, CaffeFunction)] == []


@pytest.fixture
def signature_calls(monkeypatch):
    """Counts ``inspect.signature`` calls (torch's binding makes one per apply)."""
    calls = []
    real = inspect.signature

    def counting(obj, *args, **kwargs):
        calls.append(obj)
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(inspect, "signature", counting)
    return calls


def _loss(x: torch.Tensor) -> torch.Tensor:
    log_prob, _ = log_softmax_clamped(x, 1, 1e-30)
    return log_prob[:, 0].sum()


def test_apply_binds_no_signature_outside_a_transform(signature_calls):
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    _loss(x)  # the class's arity, read once
    a, b = torch.randn(2, 3, requires_grad=True), torch.randn(2, 3)
    caffe_eltwise_in_place("SUM", [1.0, 2.0], True, a * 1, b)  # forward(op, ..., *bottoms)
    signature_calls.clear()
    (grad,) = torch.autograd.grad(_loss(x), x)
    out = caffe_eltwise_in_place("SUM", [1.0, 2.0], True, a * 1, b)
    assert signature_calls == []
    prob = torch.softmax(x.detach(), 1)
    want = torch.zeros_like(prob)
    want[:, 0] = 1
    torch.testing.assert_close(grad, want - prob)  # Caffe's gradient, from its backward
    torch.testing.assert_close(out, 2.0 * b)  # in place, SUM clears the top first: a adds 0
    assert type(out.grad_fn).__name__ == "CaffeEltwiseInPlaceBackward"  # the class's own name


def test_apply_under_a_transform_is_torchs(signature_calls):
    """torch.func needs the arguments bound as ``setup_context`` sees them: torch's own apply."""
    x = torch.randn(3, 4, dtype=torch.float64)
    _loss(x)
    signature_calls.clear()
    grad = torch.func.grad(_loss)(x)
    bound = [f for f in signature_calls if getattr(f, "__qualname__", "").endswith(".forward")]
    assert bound  # torch's apply ran, binding the arguments
    assert {f.__qualname__ for f in bound} == {"LogSoftmaxClamped.forward"}
    want = torch.zeros_like(x)
    want[:, 0] = 1
    torch.testing.assert_close(grad, want - torch.softmax(x, 1))
