"""Inference passes (torchcaffe/net/passes): each fires where it should and keeps the outputs.

Folded vs unfolded outputs are compared within the golden tolerance (rtol 1e-4, atol 1e-5).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from google.protobuf import text_format

import torchcaffe
import torchcaffe as caffe
from torchcaffe.net.passes import INFERENCE_PASSES
from torchcaffe.proto import caffe_pb2

from ..helpers.params import fill_params

FOLD, INPLACE = "fold_batchnorm_scale_into_producer", "inplace_relu"
AFFINE, SPLITS = "fold_batchnorm_into_scale", "bypass_splits"
RELU = "fuse_relu_into_producer"
LAYOUT = "channels_last_layout"
FINITE_POOL = "finite_pooling"
SIBLINGS = "merge_sibling_convolutions"
RTOL, ATOL = 1e-4, 1e-5

CONV_BN_SCALE_RELU = """
name: "t"
input: "data" input_shape { dim: 2 dim: 3 dim: 7 dim: 6 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 bias_term: false } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" }
layer { name: "sc" type: "Scale" bottom: "c" top: "c" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }
layer { name: "ip" type: "InnerProduct" bottom: "c" top: "f" inner_product_param { num_output: 5 } }
layer { name: "bn2" type: "BatchNorm" bottom: "f" top: "g" }
layer { name: "b2" type: "Bias" bottom: "g" top: "h" }
layer { name: "de" type: "Deconvolution" bottom: "c" top: "d"
  convolution_param { num_output: 2 kernel_size: 2 stride: 2 } }
layer { name: "sd" type: "Scale" bottom: "d" top: "d" }
layer { name: "relu2" type: "ReLU" bottom: "d" top: "d" relu_param { negative_slope: 0.1 } }
"""


def _randomize(net: torchcaffe.TorchNet, seed: int = 0) -> None:
    def values(t, gen):
        v = torch.rand(t.shape, generator=gen) * 1.5 + 0.25
        return v - 1.0 if t.dim() > 1 else v

    fill_params(net, values, seed)


def _net(text: str = CONV_BN_SCALE_RELU, phase: str = "test") -> torchcaffe.TorchNet:
    net = torchcaffe.load(text_format.Parse(text, caffe_pb2.NetParameter()), phase=phase)
    _randomize(net)
    return net


def _unoptimized(net, **inputs):
    net.optimize = False
    try:
        with torch.no_grad():
            return net.forward_all_blobs(**inputs)
    finally:
        net.optimize = True


def _assert_close(got, want):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL, atol=ATOL)


def _assert_inference_matches_unoptimized(net, x: torch.Tensor, names) -> None:
    """The optimized inference forward's ``names`` equal the literal layer program's."""
    want = _unoptimized(net, data=x)
    with torch.inference_mode():
        got = net(data=x)
    for name in names:
        _assert_close(got[name], want[name])


def test_passes_are_listed_in_order():
    want = [FOLD, AFFINE, SPLITS, RELU, INPLACE, SIBLINGS, FINITE_POOL, LAYOUT]
    assert [p.__name__ for p in INFERENCE_PASSES] == want


def test_fold_fires_on_conv_ip_and_deconv_chains():
    net = _net()
    program = net.optimized_program()  # observe the outputs (d, h) only
    # the conv's output feeds ip and de through a Split, which they now bypass
    # relu joins the folded conv; relu2, after a Deconvolution, runs in place
    assert program.report == {
        FOLD: 3,
        AFFINE: 0,
        SPLITS: 1,
        RELU: 1,
        INPLACE: 1,
        SIBLINGS: 0,
        FINITE_POOL: 0,
        LAYOUT: 1,
    }
    types = [s.type for s in program.steps]
    assert "Convolution+BatchNorm+Scale+ReLU" in types
    assert "InnerProduct+BatchNorm+Bias" in types
    assert "Deconvolution+Scale" in types
    assert types.count("ReLU+inplace") == 1
    assert len(program.steps) == len(net.steps) - 7
    assert "Split" not in types


def test_folded_outputs_equal_unfolded():
    net = _net()
    _assert_inference_matches_unoptimized(net, torch.randn(2, 3, 7, 6), ("d", "h"))


def test_observable_intermediate_blocks_a_non_inplace_fold():
    net = _net()
    program = net.optimized_program(["h", "d", "f"])  # f is read: bn2 cannot fold into ip
    assert program.report[FOLD] == 2
    assert program.report[AFFINE] == 1  # bn2 + b2 become one multiply-add instead
    assert "BatchNorm+Bias" in [s.type for s in program.steps]
    everything = net.optimized_program(net.blob_names)  # the in-place chains still fold
    assert everything.report[FOLD] == 2
    assert everything.report[AFFINE] == 0  # g is observable
    x = torch.randn(2, 3, 7, 6)
    want = _unoptimized(net, data=x)
    with torch.no_grad():
        partial = net.run({"data": x}, program=program)
    for name in ("h", "d", "f"):
        _assert_close(partial[name], want[name])
    with torch.no_grad():
        got = net.forward_all_blobs(data=x)
    assert set(got) == set(want)
    for name in want:
        _assert_close(got[name], want[name])


def test_fold_skipped_when_another_layer_reads_the_intermediate():
    text = (
        CONV_BN_SCALE_RELU
        + """
layer { name: "sig" type: "Sigmoid" bottom: "f" top: "p" }
"""
    )
    net = _net(text)  # splits are inserted: f feeds bn2 and sig through Split views
    assert net.optimized_program().report[FOLD] == 2


def test_no_fold_with_batch_statistics_or_autograd():
    net = _net(phase="train")
    assert net.optimized_program().report[FOLD] == 1  # only the Deconvolution + Scale
    net.eval()
    assert net.optimized_program().report[FOLD] == 3
    x = torch.randn(2, 3, 7, 6, requires_grad=True)
    out = net(data=x)["d"]  # grad enabled: the literal program, autograd works
    out.sum().backward()
    assert x.grad is not None


def test_fold_follows_a_batchnorm_switched_to_batch_statistics_alone():
    """``bn.train()`` on one layer after an inference run (unfreezing BatchNorm while the
    net is in eval) makes the next run use batch statistics, not the fold built before."""
    net = _net()
    x = torch.randn(2, 3, 7, 6)
    with torch.no_grad():
        net(data=x)  # the program folds bn into conv
        net.layer("bn").train()
        factor = net.layer("bn").scale_factor.item()
        got = net(data=x)
    assert net.layer("bn").scale_factor.item() != factor  # the batch statistics were used
    want = _unoptimized(net, data=x)
    _assert_close(got["d"], want["d"])
    net.layer("bn").eval()
    _assert_inference_matches_unoptimized(net, x, ["d", "h"])
    assert net.optimized_program().report[FOLD] == 3


def test_inplace_relu_skips_split_views_and_inputs():
    text = """
input: "data" input_shape { dim: 2 dim: 3 }
layer { name: "r0" type: "ReLU" bottom: "data" top: "data" }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "a"
  inner_product_param { num_output: 4 } }
layer { name: "r1" type: "ReLU" bottom: "a" top: "a" }
layer { name: "s1" type: "Sigmoid" bottom: "a" top: "s" }
layer { name: "t1" type: "TanH" bottom: "a" top: "t" }
"""
    net = _net(text)
    program = net.optimized_program()
    # r1 joins ip, the producer of its bottom; r0 stays: it would overwrite the caller's tensor
    assert program.report[RELU] == 1 and program.report[INPLACE] == 0
    assert "ReLU" in [s.type for s in program.steps]
    x = torch.randn(2, 3)
    keep = x.clone()
    want = _unoptimized(net, data=x)
    with torch.no_grad():
        got = net(data=x)
    assert torch.equal(x, keep)
    for name in ("s", "t"):
        _assert_close(got[name], want[name])


def test_fold_follows_param_changes_and_dtype():
    net = _net()
    x = torch.randn(2, 3, 7, 6)
    with torch.no_grad():
        net(data=x)
        net.layer("bn").variance.mul_(3.0)  # a weights load / optimizer step writes in place
        net.layer("sc").bias.add_(0.5)
        got = net(data=x)
    want = _unoptimized(net, data=x)
    _assert_close(got["d"], want["d"])
    net.double()
    with torch.no_grad():
        got = net(data=x.double())
    assert got["d"].dtype == torch.float64
    _assert_close(got["d"].float(), want["d"])


@pytest.mark.parametrize("make", [torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW])
def test_fold_follows_a_fused_optimizer_step(make):
    """A ``fused=True`` optimizer writes the params through one kernel that bumps no version
    counter; the net bumps them after its step, or inference keeps the old fold."""
    net = _net()
    x = torch.randn(2, 3, 7, 6)
    with torch.no_grad():
        net(data=x)  # folds cached
    opt = make(net.parameters(), lr=0.1, fused=True)
    net(data=x)["d"].sum().backward()
    opt.step()
    with torch.no_grad():
        got = net(data=x)
    want = _unoptimized(net, data=x)
    for name in got:
        _assert_close(got[name], want[name])


def test_an_infinite_scale_keeps_caffes_infinities_through_the_fold():
    """gamma = inf makes the folded filter of its channel +-inf, whose products over mixed
    signs sum to NaN; Caffe's Scale gives +-inf there (0 after the ReLU where negative)."""
    net = _net()
    with torch.no_grad():
        net.layer("sc").weight[1] = float("inf")
    x = torch.randn(2, 3, 7, 6)
    want = _unoptimized(net, data=x)
    assert torch.isinf(want["c"][:, 1]).any() and not torch.isnan(want["c"][:, 1]).any()
    with torch.inference_mode():
        got = net.forward_all_blobs(data=x)
    for name in want:
        np.testing.assert_allclose(
            got[name].numpy(), want[name].numpy(), rtol=RTOL, atol=ATOL, err_msg=name
        )


def test_fold_follows_a_param_replaced_by_another_tensor():
    """A blob set to a new Parameter (a user's assignment, ``load_state_dict(assign=True)``)
    is what the fold reads next: its sources are looked up in the layers each call."""
    net = _net()
    x = torch.randn(2, 3, 7, 6)
    with torch.no_grad():
        net(data=x)
        scale = net.layer("sc")
        scale.bias = torch.nn.Parameter(scale.bias + 0.5)
        state = {k: v * 2 for k, v in net.layer("conv").state_dict().items()}
        net.layer("conv").load_state_dict(state, assign=True)
        got = net(data=x)
    want = _unoptimized(net, data=x)
    for name in got:
        _assert_close(got[name], want[name])


def test_save_weights_after_fold_writes_the_original_blobs(tmp_path):
    net = _net()
    with torch.inference_mode():
        net(data=torch.randn(2, 3, 7, 6))
    path = tmp_path / "w.caffemodel"
    torchcaffe.save_weights(net, path)
    saved = caffe_pb2.NetParameter.FromString(path.read_bytes())
    layers = {lp.name: lp for lp in saved.layer}
    for name in ("conv", "bn", "sc"):
        for blob, tensor in zip(layers[name].blobs, net.layer(name).param_blobs()):
            np.testing.assert_array_equal(np.array(blob.data), tensor.detach().numpy().ravel())


def test_caffe_face_folds_inplace_chains_and_keeps_every_blob(tmp_path):
    proto = tmp_path / "net.prototxt"
    proto.write_text(CONV_BN_SCALE_RELU)
    net = caffe.Net(str(proto), caffe.TEST)
    _randomize(net.module)
    assert net.module.optimized_program(net.blobs).report[FOLD] == 2
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 6)).astype(np.float32)
    net.blobs["data"].data[...] = x
    net.forward()
    got = {k: b.data.copy() for k, b in net.blobs.items()}
    want = _unoptimized(net.module, data=torch.from_numpy(x))
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value.numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("optimize", [True, False])
def test_caffe_face_partial_forward_matches(tmp_path, optimize):
    proto = tmp_path / "net.prototxt"
    proto.write_text(CONV_BN_SCALE_RELU)
    net = caffe.Net(str(proto), caffe.TEST)
    _randomize(net.module)
    net.module.optimize = optimize
    x = np.random.default_rng(1).standard_normal((2, 3, 7, 6)).astype(np.float32)
    net.blobs["data"].data[...] = x
    net.forward(end="relu")
    after_relu = list(net.layer_dict)[list(net.layer_dict).index("relu") + 1]  # the Split
    net.forward(start=after_relu)
    want = _unoptimized(net.module, data=torch.from_numpy(x))
    for name in ("h", "d"):
        np.testing.assert_allclose(net.blobs[name].data, want[name].numpy(), rtol=RTOL, atol=ATOL)


FAN_OUT = """
input: "data" input_shape { dim: 2 dim: 3 dim: 6 dim: 6 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "a"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }
layer { name: "pool" type: "Pooling" bottom: "a" top: "p"
  pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "a" top: "b"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }
layer { name: "relu" type: "ReLU" bottom: "b" top: "b" }
layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "b" top: "s" }
"""


def test_unobserved_splits_are_bypassed_and_outputs_hold():
    net = _net(FAN_OUT)  # a has three readers: one Split
    assert [s.type for s in net.steps].count("Split") == 1
    program = net.optimized_program()
    assert program.report[SPLITS] == 1
    assert "Split" not in [s.type for s in program.steps]
    readers = {s.name for s in program.steps if "a" in s.bottoms}
    assert {"pool", "conv2", "sum"} <= readers
    assert program.report[RELU] == 1  # b's ReLU joins conv2: it alone reads conv2's top
    _assert_inference_matches_unoptimized(net, torch.randn(2, 3, 6, 6), ("p", "s"))
    # a caller who reads the Split's tops gets them
    assert net.optimized_program(net.blob_names).report[SPLITS] == 0


def test_caffe_face_folds_batchnorm_into_scale_when_the_conv_output_is_a_blob(tmp_path):
    """MobileNetV2's pattern: conv -> c, BatchNorm c -> b, Scale b -> b (in place)."""
    proto = tmp_path / "net.prototxt"
    proto.write_text("""
input: "data" input_shape { dim: 2 dim: 3 dim: 5 dim: 4 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 4 kernel_size: 1 } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "b" }
layer { name: "sc" type: "Scale" bottom: "b" top: "b" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "b" top: "b" }
""")
    net = caffe.Net(str(proto), caffe.TEST)
    _randomize(net.module)
    report = net.module.optimized_program(net.blobs).report
    assert report == {
        FOLD: 0,
        AFFINE: 1,
        SPLITS: 0,
        RELU: 0,
        INPLACE: 1,
        SIBLINGS: 0,
        FINITE_POOL: 0,
        LAYOUT: 1,
    }
    x = np.random.default_rng(2).standard_normal((2, 3, 5, 4)).astype(np.float32)
    net.blobs["data"].data[...] = x
    net.forward()
    want = _unoptimized(net.module, data=torch.from_numpy(x))
    for name in ("c", "b"):
        np.testing.assert_allclose(net.blobs[name].data, want[name].numpy(), rtol=RTOL, atol=ATOL)


def test_a_parametrized_weight_is_used_by_every_path_and_saved_as_computed(tmp_path):
    """torch.nn.utils.parametrize (weight_norm, spectral_norm, a user's own) moves a blob
    out of the layer's dicts into a property: the passes, the training program and
    save_weights read it as the layer computes it."""
    from torch.nn.utils import parametrize

    class Doubled(torch.nn.Module):
        def forward(self, w):
            return w * 2

    net = _net()
    x = torch.randn(2, 3, 7, 6)
    plain = [t.clone() for t in net.layer("conv").param_blobs()]
    parametrize.register_parametrization(net.layer("conv"), "weight", Doubled())
    want = _unoptimized(net, data=x)
    assert not torch.allclose(want["d"], _unoptimized(_net(), data=x)["d"])  # it took effect
    _assert_inference_matches_unoptimized(net, x, ["d", "h"])
    assert net.optimized_program().report[FOLD] >= 1  # the fold read the computed weight
    got = net(data=x)  # grad mode: the training program
    for name in ("d", "h"):
        _assert_close(got[name].detach(), want[name])
    torchcaffe.save_weights(net, tmp_path / "w.caffemodel")
    saved = torchcaffe.load(text_format.Parse(CONV_BN_SCALE_RELU, caffe_pb2.NetParameter()))
    torchcaffe.load_weights(saved, tmp_path / "w.caffemodel")
    torch.testing.assert_close(saved.layer("conv").param_blobs()[0], plain[0] * 2)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # the layers' shape logic
def test_a_jit_trace_reads_the_params_not_the_folds_cached_before_it():
    """torch.jit.trace records Caffe's literal program: the folds an earlier run cached would
    be baked into the graph as constants, so the traced module would go on with the old
    weights after ``load_state_dict`` or an optimizer step, and a trace taken before the
    folds were cached (that computes them) would fail the trace's own check."""
    net = _net().eval()
    x = torch.randn(2, 3, 7, 6)
    with torch.no_grad():
        net(data=x)  # the folds are cached
        traced = torch.jit.trace(net, (x,), strict=False)  # with check_trace
    assert net.optimized_program().report[FOLD] == 3
    state = {k: v * 0.5 if v.dim() else v for k, v in net.state_dict().items()}
    traced.load_state_dict(state)
    net.load_state_dict(state)
    x2 = torch.randn(2, 3, 7, 6)
    want = _unoptimized(net, data=x2)
    with torch.no_grad():
        got = traced(x2)
    for name in ("h", "d"):
        _assert_close(got[name], want[name])
    with torch.no_grad():  # a fresh net: the trace and its check both fold nothing
        torch.jit.trace(_net().eval(), (x,), strict=False)
