"""LRN: ACROSS_CHANNELS and WITHIN_CHANNEL formulas (alpha / n vs alpha / n^2, k only across,
zero borders), gradients, and Caffe's checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.cases import LayerCase
from tests.helpers.gradcheck import check_layer_gradient
from tests.helpers.graphs import functions_returning_writes
from tests.helpers.harness import make_layer
from tests.helpers.ops import RecordOps
from torchcaffe.errors import LayerParamError

CASES = [
    LayerCase("LRN", "lrn_param { local_size: 5 alpha: 0.3 beta: 0.75 k: 2 }", ((2, 7, 3, 4),)),
    LayerCase(
        "LRN",
        "lrn_param { norm_region: WITHIN_CHANNEL local_size: 3 alpha: 0.2 beta: 0.6 }",
        ((2, 3, 5, 6),),
    ),
]


def ref_lrn(x, size, alpha, beta, k, within):
    """Caffe's ReferenceLRNForward: ACROSS scale = k + alpha / n * sum of x^2 over channels
    [c - (n-1)/2, c + (n-1)/2] inside [0, C); WITHIN scale = 1 + alpha / n^2 * sum of x^2 over
    the n x n window inside the image; top = x * scale^-beta."""
    n, c, h, w = x.shape
    half = (size - 1) // 2
    scale = np.zeros_like(x)
    if not within:
        for ci in range(c):
            lo, hi = max(ci - half, 0), min(ci - half + size, c)
            scale[:, ci] = k + alpha / size * (x[:, lo:hi] ** 2).sum(axis=1)
    else:
        for hi in range(h):
            for wi in range(w):
                h0, w0 = max(hi - half, 0), max(wi - half, 0)
                h1, w1 = min(hi - half + size, h), min(wi - half + size, w)
                win = x[:, :, h0:h1, w0:w1] ** 2
                scale[:, :, hi, wi] = 1 + alpha / size**2 * win.sum(axis=(2, 3))
    return x * scale**-beta


@pytest.mark.parametrize(
    "snippet,within,size,alpha,beta,k",
    [
        ("local_size: 5 alpha: 0.3 beta: 0.75 k: 2", False, 5, 0.3, 0.75, 2.0),
        ("local_size: 3", False, 3, 1.0, 0.75, 1.0),
        ("local_size: 9 alpha: 2 beta: 1.5 k: 0.5", False, 9, 2.0, 1.5, 0.5),  # window > C
        ("norm_region: WITHIN_CHANNEL local_size: 3 alpha: 0.2 beta: 0.6", True, 3, 0.2, 0.6, 1.0),
        # k is not used WITHIN_CHANNEL: Caffe's Power layer shifts by 1
        (
            "norm_region: WITHIN_CHANNEL local_size: 5 alpha: 3 beta: 0.9 k: 7",
            True,
            5,
            3.0,
            0.9,
            None,
        ),
    ],
)
def test_forward_matches_reference(snippet, within, size, alpha, beta, k):
    layer, (x,) = make_layer(
        f"lrn_param {{ {snippet} }}", [(2, 7, 5, 6)], type="LRN", dtype=torch.float64
    )
    alpha, beta = np.float32(alpha).item(), np.float32(beta).item()  # proto floats
    want = ref_lrn(x.numpy(), size, alpha, beta, k, within)
    np.testing.assert_allclose(layer(x).numpy(), want, rtol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient(case):
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)


@pytest.mark.parametrize(
    "snippet,shape,field",
    [
        ("lrn_param { local_size: 4 }", (2, 3, 4, 5), "local_size"),
        ("lrn_param { local_size: 0 }", (2, 3, 4, 5), "local_size"),
        ("lrn_param { local_size: 3 }", (2, 3, 4), "4 axes"),
    ],
)
def test_error(snippet, shape, field):
    with pytest.raises(LayerParamError, match=rf"layer 'n1' \(LRN\).*{field}"):
        make_layer(snippet, [shape], type="LRN", name="n1")


@pytest.mark.parametrize("size,beta", [(5, 0.75), (3, 1.5), (11, 0.75)])
def test_across_channels_keeps_channels_last(size, beta):
    """The shifted-sum window gives the reference values on a channels_last input and keeps
    its memory format (the inference layout pass relies on that)."""
    snippet = f"lrn_param {{ local_size: {size} alpha: 0.4 beta: {beta} k: 1.5 }}"
    layer, (x,) = make_layer(snippet, [(2, 6, 5, 4)], type="LRN")
    xc = x.contiguous(memory_format=torch.channels_last)
    y = layer(xc)
    assert y.is_contiguous(memory_format=torch.channels_last)
    want = ref_lrn(x.double().numpy(), size, 0.4, beta, 1.5, False)
    np.testing.assert_allclose(y.double().numpy(), want, rtol=1e-6, atol=1e-7)


def test_channel_window_sum_compiled_matches_eager():
    """Under torch.compile the window sum is a sum of shifted slices (one fused kernel)."""
    from torchcaffe.ops.lrn import channel_window_sum

    sq = torch.rand(2, 7, 5, 4)
    compiled = torch.compile(channel_window_sum, fullgraph=True)
    for n in (1, 3, 5, 9):
        torch.testing.assert_close(compiled(sq, n), channel_window_sum(sq, n), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("beta", [0.75, 0.6])
@pytest.mark.parametrize("channels_last", [False, True])
def test_inference_reuses_the_square_and_gives_the_same_values(beta, channels_last):
    """With nothing recorded for a backward, the power and the product run in place on the
    square's buffer (aten's in-place forms, no out-of-place rsqrt or mul), bitwise equal to
    the autograd path, and the top keeps the bottom's memory format."""
    snippet = f"lrn_param {{ local_size: 5 alpha: 0.4 beta: {beta} k: 1.5 }}"
    layer, (x,) = make_layer(snippet, [(2, 7, 5, 4)], type="LRN")
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    want = layer(x.detach().requires_grad_(True)).detach()
    with torch.inference_mode(), RecordOps() as calls:
        got = layer(x)
    assert torch.equal(got, want)
    assert got.is_contiguous(memory_format=torch.channels_last) == channels_last
    if beta == 0.75:
        assert "rsqrt_.default" in calls.names and "rsqrt.default" not in calls.names
    else:
        assert "pow.Tensor_Scalar_out" in calls.names
    assert calls.names[-1] == "mul_.Tensor"  # the top is the reused buffer times x


def _launch_bound_lrn(monkeypatch):
    """Run the LRN in the form it takes off the CPU (one sum pooling, one pow) on the CPU."""
    from torchcaffe.ops import lrn

    monkeypatch.setattr(lrn, "launch_bound", lambda t: True)


@pytest.mark.parametrize("size", [1, 3, 5, 9])
@pytest.mark.parametrize("beta", [0.75, 1.5])
def test_the_launch_bound_form_matches_the_reference(monkeypatch, size, beta):
    _launch_bound_lrn(monkeypatch)
    snippet = f"lrn_param {{ local_size: {size} alpha: 0.4 beta: {beta} k: 1.5 }}"
    layer, (x,) = make_layer(snippet, [(2, 7, 5, 6)], type="LRN", dtype=torch.float64)
    want = ref_lrn(x.numpy(), size, np.float32(0.4).item(), beta, 1.5, False)
    np.testing.assert_allclose(layer(x).numpy(), want, rtol=1e-12)
    with torch.inference_mode():
        np.testing.assert_allclose(layer(x).numpy(), want, rtol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_launch_bound_form_has_the_gradient(monkeypatch, case):
    _launch_bound_lrn(monkeypatch)
    layer, bottoms = case.build()
    check_layer_gradient(layer, bottoms)


def test_off_the_cpu_the_window_is_one_pooling_and_autograd_copies_nothing():
    """On the meta device (what a GPU would launch): no slice updates forward, and no copies
    of slices back in the backward."""
    layer, _ = make_layer("lrn_param { local_size: 5 }", [(2, 7, 5, 4)], type="LRN")
    x = torch.randn(2, 7, 5, 4, device="meta", requires_grad=True)
    with RecordOps() as ops:
        layer(x).sum().backward()
    names = ops.names
    assert names.count("avg_pool3d.default") == 1
    assert not {"slice.Tensor", "copy_.default", "as_strided.default"} & set(names)
    assert names.count("avg_pool3d_backward.default") == 1
    assert len(names) <= 21, names  # the slice-update form: 123


@pytest.mark.parametrize("region", ["ACROSS_CHANNELS", "WITHIN_CHANNEL"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_lrn_is_the_float_one_rounded(dtype, region):
    # CaffeNet's conv1 tops reach hundreds: a float16 square past 256 is inf
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(1, 16, 6, 6, generator=g) * 150).relu().to(dtype)
    snippet = f"lrn_param {{ local_size: 5 alpha: 0.0001 beta: 0.75 norm_region: {region} }}"
    layer, _ = make_layer(snippet, [x.shape], type="LRN", bottoms=[x], dtype=dtype)
    ref, _ = make_layer(snippet, [x.shape], type="LRN", bottoms=[x.float()])
    xg = x.clone().requires_grad_(True)
    y = layer(xg)
    assert y.dtype == dtype
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(y.float(), ref(x.float()), rtol=tol, atol=tol)
    y.sum().backward()
    assert xg.grad is not None and bool(torch.isfinite(xg.grad).all())


@pytest.mark.parametrize(
    "snippet", ["local_size: 5 alpha: 0.3 beta: 0.75 k: 2", "local_size: 9 alpha: 2 beta: 1.5"]
)
def test_across_channels_backward_is_caffes_formula(snippet):
    """Under autograd on the CPU the layer runs ``AcrossChannelsLRN`` (Caffe's
    CrossChannelBackward, not autograd through the shifted in-place sums): its bottom gradient
    equals autograd's through torch's own LRN of the same formula."""
    layer, (x,) = make_layer(
        f"lrn_param {{ {snippet} }}", [(2, 7, 5, 6)], type="LRN", dtype=torch.float64
    )
    a = x.clone().requires_grad_()
    top = layer(a)
    assert type(top.grad_fn).__name__ == "AcrossChannelsLRNBackward"
    g = torch.randn(top.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    top.backward(g)
    b = x.clone().requires_grad_()
    p = layer.param
    want = torch.nn.functional.local_response_norm(b, p.local_size, p.alpha, p.beta, p.k)
    want.backward(g)
    torch.testing.assert_close(top.detach(), want.detach(), rtol=1e-12, atol=0.0)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)


def test_across_channels_top_may_be_written_in_place_before_the_backward():
    """Only the bottom is saved: a later in-place layer on the top (an in-place ReLU) leaves
    the backward valid."""
    layer, (x,) = make_layer("lrn_param { local_size: 3 }", [(2, 4, 3, 3)], type="LRN")
    a = x.clone().requires_grad_()
    top = layer(a)
    top.relu_()
    top.sum().backward()
    assert a.grad is not None and torch.isfinite(a.grad).all()


def test_compiled_across_channels_backward_equals_eager():
    """torch.compile traces ``AcrossChannelsLRN`` too (no graph break): its forward graph
    saves the bottom alone for the backward (autograd's path through the power saved the
    scale and its powers too), and the top and bottom gradient are the eager layer's."""
    from torch._dynamo.backends.common import aot_autograd

    forwards = []

    def record(gm, example_inputs):
        forwards.append(gm)
        return gm

    snippet = "lrn_param { local_size: 5 alpha: 0.3 beta: 0.75 k: 2 }"
    layer, (x,) = make_layer(snippet, [(2, 7, 5, 6)], type="LRN", dtype=torch.float64)
    g = torch.randn(2, 7, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    runs = []
    torch._dynamo.reset()
    traced = []
    aot = aot_autograd(fw_compiler=record, bw_compiler=lambda gm, _: gm)

    def backend(gm, example_inputs):
        traced.append(gm)
        return aot(gm, example_inputs)

    for fn in (layer, torch.compile(layer, backend=backend, fullgraph=True)):
        a = x.clone().requires_grad_()
        top = fn(a)
        top.backward(g)
        runs.append((top.detach(), a.grad))
    for want, got in zip(runs[0], runs[1]):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert not functions_returning_writes(traced)  # torch 2.11 lost their gradient
    (forward,) = forwards
    (output,) = [n for n in forward.graph.nodes if n.op == "output"]
    assert len(output.args[0]) == 2  # the top, and the bottom saved for the backward
