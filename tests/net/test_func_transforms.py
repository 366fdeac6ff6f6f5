"""torch.func over compiled nets: vmap over samples, per-sample gradients (vmap of grad),
jacrev, and model ensembles (functional_call over stacked params).

Each golden net fed by inputs of one batch runs under vmap as a loop over its samples runs
eagerly, and its per-sample gradients (input and params) are the loop's. Under a transform
the net runs its training program, whose folds are ops of the run (no cache keeps the
transform's wrapped params); the layers' CPU fast forms (memory-format queries, branches on
values, ``out=`` ops, oneDNN's ops) give way to plain torch ops, and every custom
autograd.Function batches. A layer that cannot run there is refused by name.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from torch.func import functional_call, grad, jacfwd, jacrev, jvp, stack_module_state, vjp, vmap
from torch.utils._python_dispatch import TorchDispatchMode

import torchcaffe
from torchcaffe.errors import UnsupportedError
from torchcaffe.formats.prototxt import read_net
from torchcaffe.net.passes.training import FrozenBatchNormFold
from torchcaffe.ops import batch_norm

from ..helpers.counting import count_calls
from ..helpers.golden import RECURRENT_NETS, InFolder, case_inputs, case_net, input_fed_cases
from .random_nets import random_net
from .test_passes_random import _load

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
CASES = input_fed_cases(GOLDEN)

# Inputs of different batch sizes (labels, a second bottom broadcast over the batch), or a
# net that cannot run one sample alone (recurrent time steps on axis 0, a Slice of axis 0,
# a Scale whose second bottom spans the batch): vmap over samples does not apply.
NOT_PER_SAMPLE = {
    *RECURRENT_NETS,
    "forks/detection_output_corner_nonshared",
    "forks/detection_output_ssd",
    "layers/bias_2bottoms",
    "layers/concat_axis0",
    "layers/crop_default",
    "layers/scale_2bottoms_axis0_bias",
    "layers/scale_2bottoms_axis2",
    "layers/silence",
    "layers/slice_axis0_equal",
}
# refused under a transform, naming the layer: a top's size depends on the values, or a
# BatchNorm on batch statistics would update its moving averages in place
REFUSED = {
    "forks/detection_evaluate": "detectionevaluate",
    "forks/proposal_rpn": "proposal",
    "nets/resnet_bottleneck_train": "bn_branch2a",
}
PER_SAMPLE = [c for c in CASES if c.id not in NOT_PER_SAMPLE and c.id not in REFUSED]
CLOSE = {"rtol": 1e-4, "atol": 1e-5, "equal_nan": True}


def _one_batch(case):
    """(net, inputs) where every input's axis 0 is the batch, else None."""
    inputs = case_inputs(case)
    n = next(iter(inputs.values())).shape[0]
    if not all(v.dim() and v.shape[0] == n for v in inputs.values()):
        return None
    net = case_net(case)
    net.eval()
    try:
        with torch.no_grad():
            net(**{k: v[:1] for k, v in inputs.items()})
    except torchcaffe.TorchCaffeError:
        return None
    return net, inputs


def _first(out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A batch-1 run's tops without their batch axis (a loss is a scalar already)."""
    return {k: v[0] if v.dim() and v.shape[0] == 1 else v for k, v in out.items()}


def _sample_run(net, names):
    """One sample's run of ``net`` over inputs ``names``, as vmap sees it."""

    def run(*xs):
        return _first(net(**{k: x.unsqueeze(0) for k, x in zip(names, xs)}))

    return run


def _total(out: dict[str, torch.Tensor]) -> torch.Tensor:
    return sum(v.float().sum() for v in out.values() if v.is_floating_point())


def test_the_cases_split_as_listed():
    """Which golden nets take samples alone is computed, not assumed: the lists above."""
    ids = {c.id for c in CASES}
    assert NOT_PER_SAMPLE <= ids and REFUSED.keys() <= ids
    with_one_batch = set()
    for case in CASES:
        if case.id in REFUSED:
            continue
        with InFolder(case.path):
            if _one_batch(case) is not None:
                with_one_batch.add(case.id)
    assert ids - with_one_batch - REFUSED.keys() == NOT_PER_SAMPLE


@pytest.mark.parametrize("case", PER_SAMPLE, ids=lambda c: c.id)
def test_vmap_runs_a_golden_net_as_a_loop_over_its_samples(case):
    with InFolder(case.path):
        net, inputs = _one_batch(case)
        names = sorted(inputs)
        n = min(2, inputs[names[0]].shape[0])
        with torch.no_grad():
            loop = [_first(net(**{k: v[i : i + 1] for k, v in inputs.items()})) for i in range(n)]
            got = vmap(_sample_run(net, names))(*[inputs[k][:n] for k in names])
    for name, value in got.items():
        torch.testing.assert_close(value, torch.stack([r[name] for r in loop]), **CLOSE)


@pytest.mark.parametrize("case", PER_SAMPLE, ids=lambda c: c.id)
def test_per_sample_gradients_are_a_loops(case):
    """vmap(grad) of the outputs' sum, to the first float input and to the params."""
    with InFolder(case.path):
        net, inputs = _one_batch(case)
        names = sorted(inputs)
        wrt = next(k for k in names if inputs[k].is_floating_point())
        params = {k: p.detach() for k, p in net.named_parameters()}

        def total(x, p, *xs):
            feed = {k: v.unsqueeze(0) for k, v in zip(names, xs)}
            feed[wrt] = x.unsqueeze(0)
            return _total(functional_call(net, p, (), feed))

        n = min(2, inputs[wrt].shape[0])
        xs = [inputs[k][:n] for k in names]
        got_x, got_p = vmap(grad(total, argnums=(0, 1)), in_dims=(0, None, *[0] * len(xs)))(
            inputs[wrt][:n], params, *xs
        )
        for i in range(n):
            feed = {k: v[i : i + 1].clone() for k, v in inputs.items()}
            feed[wrt].requires_grad_()
            net.zero_grad()
            total_i = _total(net(**feed))
            if not total_i.requires_grad:  # the net cuts the input off (Caffe's backward need)
                assert not got_x[i].any() and all(not g[i].any() for g in got_p.values())
                continue
            total_i.backward()
            x_grad = feed[wrt].grad  # None where the input is indices (Embed)
            torch.testing.assert_close(
                got_x[i], torch.zeros_like(got_x[i]) if x_grad is None else x_grad[0], **CLOSE
            )
            for k, p in net.named_parameters():
                want = p.grad if p.grad is not None else torch.zeros_like(p)
                torch.testing.assert_close(got_p[k][i], want, **CLOSE)


# every golden net but those refused, and Silence's (no output to differentiate)
DIFFERENTIABLE = [
    c
    for c in CASES
    if c.id not in REFUSED and c.id not in ("layers/silence",) and "detection_output" not in c.id
]


@pytest.mark.parametrize("case", DIFFERENTIABLE, ids=lambda c: c.id)
def test_forward_mode_is_the_transpose_of_the_backward(case):
    """<jvp(t), g> == <t, vjp(g)> through the whole net, for its float inputs and its params
    together: the layers with Caffe's own backward (custom autograd.Functions) give
    forward-mode derivatives that are its transpose (where it is linear in the top diff)."""
    with InFolder(case.path):
        net = case_net(case).eval()
        inputs = case_inputs(case)
    xs = {k: v for k, v in inputs.items() if v.is_floating_point()}
    ps = {k: p.detach() for k, p in net.named_parameters()}

    def floats(xs, ps):
        out = functional_call(net, ps, (), {**inputs, **xs})
        return {k: v for k, v in out.items() if v.is_floating_point()}

    gen = torch.Generator().manual_seed(0)

    def like(tensors):
        return {k: torch.randn(v.shape, generator=gen) for k, v in tensors.items()}

    tangents = (like(xs), like(ps))
    _, out_t = jvp(floats, (xs, ps), tangents)
    out, back = vjp(floats, xs, ps)
    g = like(out)
    bars = back(g)
    forward = sum((out_t[k].double() * g[k].double()).sum() for k in g)
    backward = sum(
        (t[k].double() * bar[k].double()).sum()
        for t, bar in zip(tangents, bars)
        for k in t
        if bar[k] is not None
    )
    torch.testing.assert_close(forward, backward, rtol=1e-3, atol=1e-4, equal_nan=True)


def test_jacfwd_of_a_net_is_jacrev():
    """Power, MVN, Normalize and the fork's ReLU6 (custom Functions each) after a
    Convolution, through forward and reverse mode."""
    net = torchcaffe.load(read_net(FUNCTIONS_NET))
    x = torch.randn(1, 3, 6, 6)
    got = jacfwd(lambda t: net(data=t)["top"])(x)
    want = jacrev(lambda t: net(data=t)["top"])(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


FUNCTIONS_NET = """
name: "functions"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 1 dim: 3 dim: 6 dim: 6 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "power" type: "Power" bottom: "conv" top: "power"
        power_param { power: 2 scale: 0.5 shift: 1 } }
layer { name: "mvn" type: "MVN" bottom: "power" top: "mvn" }
layer { name: "norm" type: "Normalize" bottom: "mvn" top: "norm"
        norm_param { scale_filler { type: "constant" value: 2 } } }
layer { name: "relu6" type: "ReLU6" bottom: "norm" top: "top" }
"""


@pytest.mark.parametrize("case_id", sorted(REFUSED))
def test_a_layer_a_transform_cannot_run_is_refused_by_name(case_id):
    case = next(c for c in CASES if c.id == case_id)
    with InFolder(case.path):
        net = case_net(case)
        inputs = case_inputs(case)
        names = sorted(inputs)
        with pytest.raises(UnsupportedError, match=f"'{REFUSED[case_id]}'.*torch.func"):
            vmap(_sample_run(net, names), in_dims=0)(*[inputs[k] for k in names])


CONV_BN_NET = """
name: "conv_bn"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 10 dim: 10 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 6 kernel_size: 3 weight_filler { type: "xavier" }
                            bias_filler { type: "constant" value: 0.1 } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv"
        batch_norm_param { use_global_stats: true } }
layer { name: "scale" type: "Scale" bottom: "conv" top: "conv"
        scale_param { bias_term: true filler { type: "gaussian" std: 1 }
                      bias_filler { type: "gaussian" std: 1 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "norm" type: "LRN" bottom: "pool" top: "norm" lrn_param { local_size: 3 } }
layer { name: "ip" type: "InnerProduct" bottom: "norm" top: "ip"
        inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
"""


def _conv_bn_net(seed: int) -> torchcaffe.TorchNet:
    torch.manual_seed(seed)
    net = torchcaffe.load(read_net(CONV_BN_NET))
    with torch.no_grad():
        for stat in net.buffers():
            stat.copy_(torch.rand_like(stat) + 0.5)  # mean, variance, scale factor
    return net.eval()


def _literal(net: torchcaffe.TorchNet, x: torch.Tensor) -> torch.Tensor:
    """The net's output from Caffe's layer-by-layer program (no passes), on a copy."""
    plain = copy.deepcopy(net)
    plain.optimize = False
    with torch.no_grad():
        return plain(data=x)["ip"]


def _stacked(nets, named) -> dict[str, torch.Tensor]:
    """The nets' params or buffers (``named``: the method's name) stacked on a new axis 0."""
    per_net = [dict(getattr(net, named)()) for net in nets]
    return {k: torch.stack([state[k].detach() for state in per_net]) for k in per_net[0]}


@pytest.fixture(params=["cpu", "gpu"])
def forms(request, monkeypatch):
    """The layers' forms for the CPU, or (on the CPU) those a GPU run takes, where launches
    cost more than arithmetic: the frozen fold as the convolution then one batch norm, the
    BatchNorm's scaled statistics from a cache (which a transform's wrapped blobs skip)."""
    if request.param == "cpu":
        yield request.param
        return
    monkeypatch.setattr(FrozenBatchNormFold, "launch_bound", lambda self, x: True)
    monkeypatch.setattr(batch_norm, "launch_bound", lambda t: True)
    taken = count_calls(monkeypatch, FrozenBatchNormFold, "producer_then_batch_norm")
    yield request.param
    assert taken[0] > 0  # the GPU's form ran


def test_an_ensemble_of_nets_runs_as_one_vmap_over_their_stacked_params(forms):
    """Three nets of one prototxt with their own weights, stacked by torch.func's
    ``stack_module_state`` (nets of one architecture are one class), run by vmap over their
    stacked params and buffers: each gets its own output, and a folded (passes-on) run of
    each net afterwards is still its own (no pass cached a fold of the transform's params)."""
    nets = [_conv_bn_net(seed) for seed in range(3)]
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        before = [net(data=x)["ip"] for net in nets]  # fills the folds' caches
    params, buffers = stack_module_state(nets)

    def run(p, b):
        return functional_call(nets[0], (p, b), (), {"data": x})["ip"]

    with torch.no_grad():
        got = vmap(run)(params, buffers)
    for i, net in enumerate(nets):
        torch.testing.assert_close(got[i], _literal(net, x), rtol=1e-5, atol=1e-6)
        with torch.no_grad():
            torch.testing.assert_close(net(data=x)["ip"], before[i], rtol=0, atol=0)


def test_jacrev_of_a_net_is_autograds_jacobian():
    net = _conv_bn_net(0)
    x = torch.randn(1, 3, 10, 10)
    got = jacrev(lambda t: net(data=t)["ip"])(x)
    want = torch.autograd.functional.jacobian(lambda t: net(data=t)["ip"], x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_per_sample_gradients_of_a_folded_net_are_a_loops(forms):
    """Per-sample param gradients through Convolution + BatchNorm + Scale + ReLU + MAX
    pooling + LRN + InnerProduct. They run the training program: on the CPU the frozen
    BatchNorm and its Scale are folded into the convolution's weights (no BatchNorm or Scale
    pass over the activations), as in the loop they are checked against."""
    net = _conv_bn_net(1)
    x = torch.randn(3, 3, 10, 10)
    params = {k: p.detach() for k, p in net.named_parameters()}

    def loss(p, sample):
        return functional_call(net, p, (), {"data": sample.unsqueeze(0)})["ip"].pow(2).sum()

    with _OpNames(over_planes=True) as ops:
        got = vmap(grad(loss), in_dims=(None, 0))(params, x)
    assert "aten.convolution.default" in ops.names
    if forms == "cpu":
        assert not {"aten.native_batch_norm.default", "aten.addcmul.default"} & ops.names
    for i in range(3):
        net.zero_grad()
        net(data=x[i : i + 1])["ip"].pow(2).sum().backward()
        for k, p in net.named_parameters():
            torch.testing.assert_close(got[k][i], p.grad, rtol=1e-5, atol=1e-6)


BATCH_STATISTICS_NET = """
name: "bn_train"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 4 dim: 2 dim: 3 dim: 3 } } }
layer { name: "bn" type: "BatchNorm" bottom: "data" top: "bn" }
"""


# the training program runs this BatchNorm and its Scale as one F.batch_norm
BATCH_STATISTICS_SCALE_NET = BATCH_STATISTICS_NET + (
    'layer { name: "scale" type: "Scale" bottom: "bn" top: "out"\n'
    "        scale_param { bias_term: true } }\n"
)


@pytest.mark.parametrize(
    "text", [BATCH_STATISTICS_NET, BATCH_STATISTICS_SCALE_NET], ids=["alone", "with_scale"]
)
@pytest.mark.parametrize("transform", ["vmap", "grad"])
def test_batch_statistics_under_a_transform_are_refused_by_name(transform, text):
    """A TRAIN BatchNorm updates its moving averages in place: under vmap each sample would
    write them; under grad, buffers the transform captured (not given to it) would be
    written; torch refuses both naming no layer. Nothing is written."""
    net = torchcaffe.load(read_net(text), phase="train")
    x = torch.randn(4, 2, 3, 3)
    before = [t.clone() for t in net.buffers()]
    with pytest.raises(UnsupportedError, match="'bn'.*batch statistics.*torch.func"):
        if transform == "vmap":
            vmap(lambda s: net(data=s.unsqueeze(0))["bn"])(x)
        else:
            grad(lambda t: net(data=t)["bn"].sum())(x)
    for kept, now in zip(before, net.buffers()):
        assert torch.equal(kept, now)


CHAIN_NET = """
name: "chain"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv"
        batch_norm_param { use_global_stats: true } }
layer { name: "scale" type: "Scale" bottom: "conv" top: "out" scale_param { bias_term: true } }
"""


def test_an_ensemble_member_with_an_infinite_scale_gets_caffes_values():
    """Over stacked params the fold cannot ask whether its weights are finite, so the chain
    runs layer by layer for every member: one whose Scale is infinite gets Caffe's +-inf
    where the folded filters' sums over mixed signs would give NaN."""
    nets = []
    for seed in range(2):
        torch.manual_seed(seed)
        nets.append(torchcaffe.load(read_net(CHAIN_NET)).eval())
    with torch.no_grad():
        nets[1].layers["scale"].weight[0] = math.inf
    x = torch.randn(2, 3, 6, 6)
    params, buffers = _stacked(nets, "named_parameters"), _stacked(nets, "named_buffers")

    def run(p, b):
        return functional_call(nets[0], (p, b), (), {"data": x})["out"]

    with torch.no_grad():
        got = vmap(run)(params, buffers)
    assert torch.isinf(got[1]).any()
    for i, net in enumerate(nets):
        plain = copy.deepcopy(net)
        plain.optimize = False
        with torch.no_grad():
            want = plain(data=x)["out"]
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "text", [BATCH_STATISTICS_NET, BATCH_STATISTICS_SCALE_NET], ids=["alone", "with_scale"]
)
def test_batch_statistics_under_grad_update_the_buffers_it_is_given(text):
    """Under grad (and jvp) alone, with the buffers given to ``functional_call`` as arguments
    of the transformed function (torch's own BatchNorm works so), a TRAIN BatchNorm
    normalizes by the batch's statistics and updates those buffers: the gradient, the
    directional derivative and the updated statistics are two eager steps', and the net's own
    buffers are left alone."""
    net = torchcaffe.load(read_net(text), phase="train")
    twin = copy.deepcopy(net)
    x = torch.randn(4, 2, 3, 3)
    top = "out" if "scale" in net.layers else "bn"
    params = {k: p.detach() for k, p in net.named_parameters()}
    buffers = {k: b.clone() for k, b in net.named_buffers()}
    kept = {k: b.clone() for k, b in net.named_buffers()}

    def loss(x, p, b):
        return functional_call(net, (p, b), (), {"data": x})[top].pow(3).sum()

    got = grad(loss)(x, params, buffers)
    sample = x.clone().requires_grad_()
    twin(data=sample)[top].pow(3).sum().backward()
    torch.testing.assert_close(got, sample.grad, rtol=1e-5, atol=1e-6)
    # forward mode too: jvp along x (zero tangents for the params and buffers)
    t = torch.randn_like(x)
    zeros = [{k: torch.zeros_like(v) for k, v in d.items()} for d in (params, buffers)]
    _, got_t = jvp(loss, (x, params, buffers), (t, *zeros))
    twin(data=x)  # the eager twin's second step, as jvp's forward was the second here
    want_t = (sample.grad * t).sum()
    torch.testing.assert_close(got_t, want_t, rtol=1e-4, atol=1e-5)
    for k, b in twin.named_buffers():
        torch.testing.assert_close(buffers[k], b, rtol=0, atol=0)
        assert torch.equal(dict(net.named_buffers())[k], kept[k])
    assert not torch.equal(buffers["layers.bn.mean"], kept["layers.bn.mean"])


WIDE_NET = """
name: "wide"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 64 dim: 8 dim: 8 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 64 kernel_size: 1 weight_filler { type: "xavier" } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 128 weight_filler { type: "xavier" } } }
"""


class _OpNames(TorchDispatchMode):
    """The names of the aten-level ops a run dispatches (under vmap: what runs per batch);
    ``over_planes``: only those whose first output has 4 axes or more (an activation, not a
    per-channel vector)."""

    def __init__(self, over_planes: bool = False) -> None:
        super().__init__()
        self.names: set[str] = set()
        self.over_planes = over_planes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        first = out[0] if isinstance(out, (tuple, list)) else out
        if not self.over_planes or (isinstance(first, torch.Tensor) and first.dim() >= 4):
            self.names.add(str(func))
        return out


def test_no_onednn_op_runs_under_a_transform():
    """torch.func has no batching rule for oneDNN's ops (its fallback loops over samples and
    warns on each call); under a transform the net takes torch's own. Eagerly it takes
    oneDNN's, so this net can tell."""
    net = torchcaffe.load(read_net(WIDE_NET))
    x = torch.randn(2, 64, 8, 8)
    with torch.no_grad(), _OpNames() as eager:
        want = net(data=x)["ip"]
    with torch.no_grad(), _OpNames() as batched:
        got = vmap(lambda s: net(data=s.unsqueeze(0))["ip"][0])(x)
    assert any(name.startswith("mkldnn.") for name in eager.names)
    assert not any(name.startswith("mkldnn.") for name in batched.names), batched.names
    torch.testing.assert_close(got, want, **CLOSE)  # oneDNN's sums and MKL's differ in order


def test_dynamo_traces_the_caffe_gradient_functions_of_a_training_forward():
    """Each Function keeps its forward-mode rule as ``tangent`` and gets a ``jvp`` only where
    forward mode may run (``with_jvp``): dynamo breaks the graph at a Function that defines
    one, in every compiled training forward."""
    net = torchcaffe.load(read_net(FUNCTIONS_NET))
    x = torch.randn(1, 3, 6, 6)
    torch._dynamo.reset()
    report = torch._dynamo.explain(lambda: net(data=x)["top"].sum())()
    assert report.graph_break_count == 0, [str(b.reason)[:200] for b in report.break_reasons]


@pytest.mark.parametrize("wide", [False, True], ids=["core", "wide"])
@pytest.mark.parametrize("seed", range(0, 200, 25))
def test_random_nets_under_vmap_grad_and_jvp(seed, wide):
    """Random nets (the wider catalogue: forks' layers, Crop, Tile, MVN...): vmap over
    samples and per-sample input gradients equal a loop over the samples, and forward mode
    is the backward's transpose, except through an in-place layer whose Caffe backward writes
    its slope squared, ignoring the top diff (no linear map to transpose). Seeds 0-199 all
    passed when this was written."""
    spec = random_net(seed, wide=wide)
    net = _load(spec.text, "test", seed).eval()
    x = torch.randn(*spec.input_shape, generator=torch.Generator().manual_seed(seed))
    run = _sample_run(net, ["data"])
    with torch.no_grad():
        got = vmap(run)(x)
        loop = [run(x[i]) for i in range(x.shape[0])]
    for name, value in got.items():
        torch.testing.assert_close(value, torch.stack([r[name] for r in loop]), **CLOSE)
    per_sample = vmap(grad(lambda s: _total(run(s))))(x)
    for i in range(x.shape[0]):
        sample = x[i : i + 1].clone().requires_grad_()
        total = _total(net(data=sample))
        if total.requires_grad:
            total.backward()
            want = torch.zeros_like(x[i]) if sample.grad is None else sample.grad[0]
            torch.testing.assert_close(per_sample[i], want, **CLOSE)  # None: data cut off
    if any(
        getattr(m, "in_place_slope", False) and m.slope_overwrites_top_diff
        for m in net.layers.values()
    ):
        return
    floats = lambda z: {k: v for k, v in net(data=z).items() if v.is_floating_point()}  # noqa: E731
    t = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed + 1))
    _, out_t = jvp(floats, (x,), (t,))
    out, back = vjp(floats, x)
    g = {
        k: torch.randn(v.shape, generator=torch.Generator().manual_seed(seed + 2))
        for k, v in out.items()
    }
    (x_bar,) = back(g)
    forward = sum((out_t[k].double() * g[k].double()).sum() for k in g)
    torch.testing.assert_close(forward, (t.double() * x_bar.double()).sum(), rtol=1e-3, atol=1e-3)
