"""caffemodel -> state_dict -> caffemodel keeps every blob bit-exact."""

from __future__ import annotations

import pytest
import torch

import torchcaffe
from torchcaffe.converters import caffemodel_to_state_dict, state_dict_to_caffemodel
from torchcaffe.errors import WeightsError

NET = """
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" } } }
"""


def test_round_trip_is_bit_exact(tmp_path):
    proto = tmp_path / "net.prototxt"
    proto.write_text(NET)
    original = torchcaffe.load(proto)
    torchcaffe.save_weights(original, tmp_path / "a.caffemodel")
    caffemodel_to_state_dict(proto, tmp_path / "a.caffemodel", tmp_path / "a.pt")
    state = torch.load(tmp_path / "a.pt", weights_only=True)
    assert torch.equal(state["layers.conv.weight"], original.layer("conv").weight)
    state_dict_to_caffemodel(proto, tmp_path / "a.pt", tmp_path / "b.caffemodel")
    assert (tmp_path / "a.caffemodel").read_bytes() == (tmp_path / "b.caffemodel").read_bytes()


def test_mismatched_state_dict_is_a_weights_error(tmp_path):
    proto = tmp_path / "net.prototxt"
    proto.write_text(NET)
    torch.save({"layers.other.weight": torch.zeros(1)}, tmp_path / "bad.pt")
    with pytest.raises(WeightsError, match="does not fit"):
        state_dict_to_caffemodel(proto, tmp_path / "bad.pt", tmp_path / "x.caffemodel")


class _NotATensor:
    pass


@pytest.mark.parametrize("content", ["random", "pickled_object"])
def test_unreadable_state_dict_is_one_line_without_torchs_advice(tmp_path, content):
    """torch.load's refusal is a paragraph that advises weights_only=False (running the
    file's code); the error keeps one line: its reason."""
    proto = tmp_path / "net.prototxt"
    proto.write_text(NET)
    bad = tmp_path / "bad.pt"
    if content == "random":
        bad.write_bytes(bytes(range(256)) * 4)
    else:
        torch.save({"x": _NotATensor()}, bad)
    with pytest.raises(WeightsError, match=r"bad\.pt: cannot read a state_dict") as err:
        state_dict_to_caffemodel(proto, bad, tmp_path / "x.caffemodel")
    assert "\n" not in str(err.value) and "weights_only" not in str(err.value)
    assert not (tmp_path / "x.caffemodel").exists()


# -- readable keys and safetensors ---------------------------------------------------------
BN_NET = """
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 5 dim: 4 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1"
        scale_param { bias_term: true filler { type: "gaussian" }
                      bias_filler { type: "gaussian" } } }
layer { name: "fc" type: "InnerProduct" bottom: "conv1" top: "fc"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" } } }
"""


def _bn_net(tmp_path, factor):
    proto = tmp_path / "bn.prototxt"
    proto.write_text(BN_NET)
    net = torchcaffe.load(proto)
    mean, var, sf = net.layer("bn1").param_blobs()
    with torch.no_grad():
        mean.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]) * factor)
        var.copy_(torch.tensor([0.5, 1.0, 1.5, 2.0]) * factor)
        sf.fill_(factor)
    torchcaffe.save_weights(net, tmp_path / "bn.caffemodel")
    return proto, net


def test_readable_keys_fold_batch_norm_scale_factor(tmp_path):
    proto, net = _bn_net(tmp_path, 999.0)
    caffemodel_to_state_dict(proto, tmp_path / "bn.caffemodel", tmp_path / "r.pt", readable=True)
    state = torch.load(tmp_path / "r.pt", weights_only=True)
    assert sorted(state) == [
        "bn1.bias",
        "bn1.num_batches_tracked",
        "bn1.running_mean",
        "bn1.running_var",
        "bn1.weight",
        "conv1.bias",
        "conv1.weight",
        "fc.bias",
        "fc.weight",
    ]
    torch.testing.assert_close(state["bn1.running_mean"], torch.tensor([1.0, 2.0, 3.0, 4.0]))
    torch.testing.assert_close(state["bn1.running_var"], torch.tensor([0.5, 1.0, 1.5, 2.0]))
    assert torch.equal(state["bn1.weight"], net.layer("scale1").weight)
    # torch's BatchNorm2d with these stats computes what Caffe's BatchNorm + Scale compute
    bn = torch.nn.BatchNorm2d(4, eps=1e-5).eval()
    bn.load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("bn1.")})
    x = torch.randn(2, 3, 5, 4)
    blobs = net.eval().forward_all_blobs(data=x)
    conv = torch.nn.functional.conv2d(x, state["conv1.weight"], state["conv1.bias"])
    fc = torch.nn.functional.linear(bn(conv).flatten(1), state["fc.weight"], state["fc.bias"])
    torch.testing.assert_close(fc, blobs["fc"], rtol=1e-5, atol=1e-5)


def test_readable_zero_scale_factor_gives_zero_stats(tmp_path):
    proto, _ = _bn_net(tmp_path, 0.0)
    caffemodel_to_state_dict(proto, tmp_path / "bn.caffemodel", tmp_path / "r.pt", readable=True)
    state = torch.load(tmp_path / "r.pt", weights_only=True)
    assert not state["bn1.running_mean"].any() and not state["bn1.running_var"].any()


def test_readable_round_trip_writes_equivalent_caffemodel(tmp_path):
    proto, net = _bn_net(tmp_path, 4.0)
    caffemodel_to_state_dict(proto, tmp_path / "bn.caffemodel", tmp_path / "r.pt", readable=True)
    state_dict_to_caffemodel(proto, tmp_path / "r.pt", tmp_path / "back.caffemodel")
    again = torchcaffe.load(proto, tmp_path / "back.caffemodel")
    assert float(again.layer("bn1").scale_factor) == 1.0
    x = torch.randn(2, 3, 5, 4)
    torch.testing.assert_close(again.eval()(data=x)["fc"], net.eval()(data=x)["fc"])


def test_readable_keys_that_do_not_fit_name_them(tmp_path):
    proto, _ = _bn_net(tmp_path, 1.0)
    torch.save(
        {"conv1.weight": torch.zeros(4, 3, 3, 3), "extra": torch.zeros(1)}, tmp_path / "x.pt"
    )
    with pytest.raises(WeightsError, match=r"missing \['conv1.bias'.*unexpected \['extra'\]"):
        state_dict_to_caffemodel(proto, tmp_path / "x.pt", tmp_path / "out.caffemodel")
    assert not (tmp_path / "out.caffemodel").exists()


def test_safetensors_round_trip(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    from torchcaffe.converters import caffemodel_to_safetensors, safetensors_to_caffemodel

    proto, net = _bn_net(tmp_path, 2.0)
    caffemodel_to_safetensors(proto, tmp_path / "bn.caffemodel", tmp_path / "w.safetensors")
    tensors = st.load_file(tmp_path / "w.safetensors")
    assert torch.equal(tensors["conv1.weight"], net.layer("conv1").weight)
    torch.testing.assert_close(tensors["bn1.running_var"], torch.tensor([0.5, 1.0, 1.5, 2.0]))
    safetensors_to_caffemodel(proto, tmp_path / "w.safetensors", tmp_path / "back.caffemodel")
    again = torchcaffe.load(proto, tmp_path / "back.caffemodel")
    assert torch.equal(again.layer("fc").weight, net.layer("fc").weight)


def test_exported_torch_model_reloads_from_readable_state_dict(tmp_path):
    """torch model -> Caffe files -> readable state_dict -> the same torch model, strictly."""
    from .torch_models import ResNet18, randomize_batch_norm

    model = randomize_batch_norm(ResNet18(num_classes=5, width=8))
    torchcaffe.export(
        model, torch.randn(1, 3, 32, 32), tmp_path / "r.prototxt", tmp_path / "r.caffemodel"
    )
    caffemodel_to_state_dict(
        tmp_path / "r.prototxt", tmp_path / "r.caffemodel", tmp_path / "r.pt", readable=True
    )
    state = torch.load(tmp_path / "r.pt", weights_only=True)
    fresh = ResNet18(num_classes=5, width=8)
    fresh.load_state_dict(state, strict=True)
    for key, value in model.state_dict().items():
        if not key.endswith("num_batches_tracked"):
            torch.testing.assert_close(fresh.state_dict()[key], value, rtol=1e-6, atol=0)


def test_a_readable_tensor_of_another_shape_but_the_same_count_is_refused(tmp_path):
    """For an InnerProduct with transpose: true the readable weight is nn.Linear's (5, 8);
    Caffe's own (8, 5) has the same count, and a reshape would scramble it silently."""
    proto = tmp_path / "tp.prototxt"
    proto.write_text(
        'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 8 } } }\n'
        'layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc"\n'
        "  inner_product_param { num_output: 5 transpose: true } }\n"
    )
    lin = torch.nn.Linear(8, 5)
    torch.save(
        {"fc.weight": lin.weight.detach().t(), "fc.bias": lin.bias.detach()}, tmp_path / "w.pt"
    )
    with pytest.raises(WeightsError, match=r"shape mismatch for 'fc.weight'.*\(8, 5\).*\(5, 8\)"):
        state_dict_to_caffemodel(proto, tmp_path / "w.pt", tmp_path / "out.caffemodel")
    # axes of size 1 may differ: a (5, 1) bias column is still the (5,) bias
    torch.save({"fc.weight": lin.weight.detach(), "fc.bias": lin.bias.detach()[:, None]},
               tmp_path / "ok.pt")  # fmt: skip
    state_dict_to_caffemodel(proto, tmp_path / "ok.pt", tmp_path / "ok.caffemodel")
    net = torchcaffe.load(proto, tmp_path / "ok.caffemodel")
    x = torch.randn(1, 8)
    torch.testing.assert_close(net(data=x)["fc"], lin(x).detach())


def test_readable_transposed_inner_product_is_in_linear_layout(tmp_path):
    """``transpose: true`` stores the weight (K, N); the readable key holds nn.Linear's (N, K)
    (a square one would otherwise load into nn.Linear silently transposed), and back."""
    proto = tmp_path / "t.prototxt"
    proto.write_text(
        'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 4 } } }'
        ' layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc" inner_product_param {'
        ' num_output: 4 transpose: true weight_filler { type: "gaussian" } } }'
    )
    net = torchcaffe.load(proto)
    torchcaffe.save_weights(net, tmp_path / "t.caffemodel")
    caffemodel_to_state_dict(proto, tmp_path / "t.caffemodel", tmp_path / "r.pt", readable=True)
    state = torch.load(tmp_path / "r.pt", weights_only=True)
    linear = torch.nn.Linear(4, 4)
    linear.load_state_dict({k[3:]: v for k, v in state.items()})
    x = torch.randn(2, 4)
    torch.testing.assert_close(linear(x), net(data=x)["fc"])
    state_dict_to_caffemodel(proto, tmp_path / "r.pt", tmp_path / "back.caffemodel")
    assert (tmp_path / "back.caffemodel").read_bytes() == (tmp_path / "t.caffemodel").read_bytes()
