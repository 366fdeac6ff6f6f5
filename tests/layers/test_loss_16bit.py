"""Loss layers of a .half() / .bfloat16() net: Caffe's float loss where float16 overflows.

A float16 sum past 65504 (or a square of a difference past 256) is inf, and the 1e-20 log
threshold is 0 in float16; the layers compute in float32 and round the loss once.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.harness import make_layer, run


def _bottoms(type_: str, g: torch.Generator) -> list[torch.Tensor]:
    if type_ == "EuclideanLoss":  # sum of squares ~ 2.6e5, loss ~ 2000
        return [torch.randn(64, 1000, generator=g) * 2, torch.randn(64, 1000, generator=g) * 2]
    if type_ == "HingeLoss":
        labels = torch.randint(0, 1000, (64,), generator=g).float()
        return [torch.randn(64, 1000, generator=g) * 3, labels]
    if type_ == "ContrastiveLoss":  # one pair 300 apart: its square is past 65504
        a, b = torch.randn(64, 16, generator=g), torch.randn(64, 16, generator=g)
        a[0, 0] = 300.0
        return [a, b, torch.ones(64)]
    if type_ == "MultinomialLogisticLoss":  # a probability 0 at the label: -log(1e-20)
        p = torch.softmax(torch.randn(64, 10, generator=g), 1)
        p[0, 3] = 0.0
        labels = torch.randint(0, 10, (64,), generator=g).float()
        labels[0] = 3
        return [p, labels]
    assert type_ == "SmoothL1Loss"
    return [torch.randn(64, 4, 32, 32, generator=g) * 3, torch.randn(64, 4, 32, 32, generator=g)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "type_",
    ["EuclideanLoss", "HingeLoss", "ContrastiveLoss", "MultinomialLogisticLoss", "SmoothL1Loss"],
)
def test_16bit_loss_is_the_float_loss_rounded(type_, dtype):
    bottoms = [b.to(dtype) for b in _bottoms(type_, torch.Generator().manual_seed(5))]
    shapes = [b.shape for b in bottoms]
    layer, _ = make_layer("", shapes, type=type_, bottoms=bottoms, dtype=dtype)
    ref, _ = make_layer("", shapes, type=type_, bottoms=[b.float() for b in bottoms])
    x = bottoms[0].clone().requires_grad_(True)
    (loss,) = run(layer, [x, *bottoms[1:]])
    (want,) = run(ref, [b.float() for b in bottoms])
    assert loss.dtype == dtype
    assert torch.isfinite(want) and want.abs() < 6e4
    torch.testing.assert_close(
        loss.float(), want, rtol=1e-2 if dtype == torch.bfloat16 else 1e-3, atol=0
    )
    loss.backward()
    assert x.grad is not None and x.grad.dtype == dtype
