"""The Caffe face: `import torchcaffe as caffe` behaves as pycaffe's caffe.Net does."""

from __future__ import annotations

import numpy as np
import pytest

import torchcaffe as caffe
from torchcaffe.errors import BlobWiringError, UnknownNameError, UsageError, WeightsError

NET = """
name: "face"
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 3 dim: 4 } shape { dim: 3 dim: 2 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.7 }
                              bias_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.7 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


@pytest.fixture
def prototxt(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    return str(path)


def reference(net, x, label):
    """float64 forward/backward of the same MLP, written out by hand."""
    w1, b1 = (p.data.astype(np.float64) for p in net.params["ip1"])
    w2, b2 = (p.data.astype(np.float64) for p in net.params["ip2"])
    a = x @ w1.T + b1
    h = np.maximum(a, 0)
    y = h @ w2.T + b2
    n = x.shape[0]
    loss = ((y - label) ** 2).sum() / (2 * n)
    dy = (y - label) / n
    dw2, db2 = dy.T @ h, dy.sum(0)
    dh = dy @ w2
    da = dh * (a > 0)
    return dict(
        y=y, loss=loss, dy=dy, dw2=dw2, db2=db2, da=da, dw1=da.T @ x, db1=da.sum(0), dx=da @ w1
    )


def test_attributes_match_pycaffe(prototxt):
    net = caffe.Net(prototxt, caffe.TRAIN)
    assert list(net.blobs) == ["data", "label", "ip1", "ip2", "loss"]
    assert list(net.params) == ["ip1", "ip2"]
    assert net._layer_names == ["data", "ip1", "relu1", "ip2", "loss"]
    assert [layer.type for layer in net.layers] == [
        "Input",
        "InnerProduct",
        "ReLU",
        "InnerProduct",
        "EuclideanLoss",
    ]
    assert list(net.layer_dict) == net._layer_names
    assert net.inputs == ["data", "label"] and net.outputs == ["loss"]
    assert net.blobs["data"].data.shape == (3, 4)
    assert net.params["ip1"][0].data.shape == (5, 4)
    assert net.blob_loss_weights["loss"] == 1.0


def test_forward_backward_match_hand_written_reference(prototxt):
    net = caffe.Net(prototxt, caffe.TRAIN)
    rng = np.random.default_rng(0)
    x, label = rng.standard_normal((3, 4)), rng.standard_normal((3, 2))
    net.blobs["data"].data[...] = x
    net.blobs["label"].data[...] = label
    out = net.forward()
    ref = reference(net, x, label)
    np.testing.assert_allclose(out["loss"], ref["loss"], rtol=1e-5)
    net.backward()
    np.testing.assert_allclose(net.blobs["ip2"].diff, ref["dy"], rtol=1e-4, atol=1e-6)
    # ip1 is computed in place by relu1: its diff is the gradient w.r.t. the ReLU input
    np.testing.assert_allclose(net.blobs["ip1"].diff, ref["da"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(net.params["ip2"][0].diff, ref["dw2"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(net.params["ip2"][1].diff, ref["db2"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(net.params["ip1"][0].diff, ref["dw1"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(net.params["ip1"][1].diff, ref["db1"], rtol=1e-4, atol=1e-6)


def test_param_diffs_accumulate_until_cleared(prototxt):
    net = caffe.Net(prototxt, caffe.TRAIN)
    net.blobs["data"].data[...] = np.arange(12).reshape(3, 4) / 10
    net.forward()
    net.backward()
    once = net.params["ip2"][0].diff.copy()
    net.forward()
    net.backward()
    np.testing.assert_allclose(net.params["ip2"][0].diff, 2 * once, rtol=1e-5)
    net.clear_param_diffs()
    assert not net.params["ip2"][0].diff.any()


def test_writing_param_data_changes_the_forward(prototxt):
    net = caffe.Net(prototxt, caffe.TEST)
    net.params["ip2"][0].data[...] = 0
    net.params["ip2"][1].data[...] = [1.5, -2.0]
    net.forward()
    np.testing.assert_allclose(net.blobs["ip2"].data, [[1.5, -2.0]] * 3)


def test_forward_start_end_and_kwargs(prototxt):
    net = caffe.Net(prototxt, caffe.TEST)
    net.blobs["data"].data[...] = 1.0
    out = net.forward(end="ip1")
    assert set(out) == {"ip1"}
    net.blobs["ip1"].data[...] = 0.0
    out = net.forward(start="ip2", end="ip2")
    np.testing.assert_allclose(out["ip2"], np.broadcast_to(net.params["ip2"][1].data, (3, 2)))
    with pytest.raises(UnknownNameError, match="ip3"):
        net.forward(end="ip3")
    with pytest.raises(KeyError):  # a missing name is also a lookup error, as in a dict
        net.forward(start="nope")
    with pytest.raises(ValueError):  # and pycaffe's list.index error
        net.forward(start="nope")
    with pytest.raises(ValueError):
        net.backward(end="nope")


def test_layer_indices_out_of_range_are_refused_not_wrapped(prototxt):
    # Net::ForwardFromTo CHECKs start >= 0 and end < layers; BackwardFromTo end >= 0 and
    # start < layers. A -1 must not run the last layer first, as Python indexing would.
    net = caffe.Net(prototxt, caffe.TRAIN)
    net.blobs["data"].data[...] = 1.0
    net.forward()
    ip2 = net.blobs["ip2"].data.copy()
    net.params["ip2"][0].data[...] = 0
    for start, end in ((-1, 0), (0, len(net.layers))):
        with pytest.raises(IndexError, match="_forward layer index out of range"):
            net._forward(start, end)
    np.testing.assert_array_equal(net.blobs["ip2"].data, ip2)
    for start, end in ((1, -1), (len(net.layers), 0)):
        with pytest.raises(IndexError, match="_backward layer index out of range"):
            net._backward(start, end)
    assert net._forward(2, 1) == 0.0  # an empty range runs nothing, as Caffe's loop


BRANCHED = """
name: "branched"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "ipa" type: "InnerProduct" bottom: "ip" top: "a"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 1 }
                              bias_filler { type: "constant" value: 0.25 } } }
layer { name: "sig" type: "Sigmoid" bottom: "ip" top: "s" }
"""


@pytest.mark.parametrize("force_backward", [False, True])
def test_forward_past_a_split_reads_the_edited_bottom(tmp_path, force_backward):
    # "ip" feeds two layers, so Caffe inserts a Split whose tops share ip's data: an edit
    # of net.blobs["ip"] reaches both branches of a forward started after the split.
    path = tmp_path / "branched.prototxt"
    path.write_text(("force_backward: true\n" if force_backward else "") + BRANCHED)
    net = caffe.Net(str(path), caffe.TEST)
    assert "Split" in [layer.type for layer in net.layers]
    net.forward(data=np.ones((2, 3)))
    net.blobs["ip"].data[...] = 0
    out = net.forward(start="ipa")
    np.testing.assert_array_equal(out["a"], np.full((2, 2), 0.25, np.float32))
    np.testing.assert_array_equal(out["s"], np.full((2, 4), 0.5, np.float32))


def test_backward_with_top_diff_kwargs():
    # Without a loss Caffe prunes every backward unless force_backward is set.
    no_loss = "force_backward: true\n" + NET.split('layer { name: "loss"')[0]
    face = caffe.Net(_write(no_loss), caffe.TRAIN)
    face.blobs["data"].data[...] = np.linspace(-1, 1, 12).reshape(3, 4)
    face.forward()
    top = np.ones((3, 2))
    diffs = face.backward(ip2=top, label=np.zeros((3, 2)), diffs=["ip1"])
    w2 = face.params["ip2"][0].data
    mask = face.blobs["ip1"].data > 0
    np.testing.assert_allclose(diffs["ip1"], (top @ w2) * mask, rtol=1e-5, atol=1e-7)
    with pytest.raises(BlobWiringError, match=r"^Top diff arguments do not match net outputs\."):
        face.backward(nope=top)
    with pytest.raises(BlobWiringError, match=r"^Diff is not batch sized \(blob 'ip2'\)"):
        face.backward(ip2=np.ones((2, 2)), label=np.zeros((3, 2)))
    with pytest.raises(Exception, match=r"^Input blob arguments do not match net inputs\."):
        face.forward(data=np.ones((3, 4)))
    with pytest.raises(Exception, match=r"^Input is not batch sized \(blob 'data'\)"):
        face.forward(data=np.ones((2, 4)), label=np.zeros((3, 2)))


def test_backward_is_pruned_without_loss_or_force_backward():
    face = caffe.Net(_write(NET.split('layer { name: "loss"')[0]), caffe.TRAIN)
    face.blobs["data"].data[...] = 1.0
    face.forward()
    diffs = face.backward(ip2=np.ones((3, 2)), label=np.zeros((3, 2)), diffs=["ip1"])
    assert not diffs["ip1"].any()


def _write(text: str) -> str:
    import tempfile

    f = tempfile.NamedTemporaryFile("w", suffix=".prototxt", delete=False)
    f.write(text)
    f.close()
    return f.name


def test_blob_reshape_then_net_reshape(prototxt):
    net = caffe.Net(prototxt, caffe.TEST)
    net.blobs["data"].reshape(7, 4)
    net.blobs["label"].reshape(7, 2)
    net.reshape()
    assert net.blobs["ip2"].data.shape == (7, 2)
    net.forward()


def test_forward_all_batches_and_concatenates(prototxt):
    net = caffe.Net(prototxt, caffe.TEST)
    x = np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32)
    w1, b1 = net.params["ip1"][0].data, net.params["ip1"][1].data
    w2, b2 = net.params["ip2"][0].data, net.params["ip2"][1].data
    result = net.forward_all(blobs=["ip2"], data=x, label=np.zeros((8, 2), np.float32))
    want = np.maximum(x @ w1.T + b1, 0) @ w2.T + b2
    np.testing.assert_allclose(result["ip2"], want, rtol=1e-5, atol=1e-6)
    loss = [name for name in result if result[name].ndim == 1 and name != "ip2"]
    assert loss == ["loss"] and result["loss"].shape == (3,), "batch 3 over 8 items: 3 forwards"


def test_save_copy_from_and_constructor_forms(prototxt, tmp_path):
    a = caffe.Net(prototxt, caffe.TEST)
    weights = str(tmp_path / "w.caffemodel")
    a.save(weights)
    for b in (
        caffe.Net(prototxt, weights, caffe.TEST),
        caffe.Net(prototxt, caffe.TEST, weights=weights),
        caffe.Net(prototxt, weights=weights, phase=caffe.TEST),
    ):
        for name in a.params:
            for pa, pb in zip(a.params[name], b.params[name]):
                np.testing.assert_array_equal(pa.data, pb.data)
    with pytest.raises(UsageError, match="phase"):
        caffe.Net(prototxt)
    with pytest.raises(TypeError, match="at most 3 positional"):
        caffe.Net(prototxt, weights, caffe.TEST, "extra")
    with pytest.raises(UsageError, match="weights twice"):
        caffe.Net(prototxt, weights, weights=weights)
    with pytest.raises(WeightsError):
        caffe.Net(prototxt, str(tmp_path / "missing.caffemodel"), caffe.TEST)


def test_missing_files_are_runtime_errors_as_in_pycaffe(prototxt, tmp_path):
    """pycaffe's Net raises RuntimeError("Could not open file ...") for a missing net or
    weights file, and scripts catch that; ours are TorchCaffeErrors that are RuntimeErrors too."""
    with pytest.raises(RuntimeError, match="file not found"):
        caffe.Net(str(tmp_path / "missing.prototxt"), caffe.TEST)
    with pytest.raises(RuntimeError, match="weights file not found"):
        caffe.Net(prototxt, str(tmp_path / "missing.caffemodel"), caffe.TEST)


def test_share_with_uses_the_same_memory(prototxt):
    a, b = caffe.Net(prototxt, caffe.TRAIN), caffe.Net(prototxt, caffe.TEST)
    b.share_with(a)
    a.params["ip1"][0].data[...] = 0.25
    np.testing.assert_array_equal(b.params["ip1"][0].data, 0.25)


def test_pycaffe_module_level_names():
    assert caffe.TRAIN == 0 and caffe.TEST == 1
    assert "Convolution" in caffe.layer_type_list()
    assert caffe.proto.caffe_pb2.NetParameter
    caffe.set_mode_cpu()
    caffe.set_random_seed(3)


def test_start_end_return_the_end_layers_tops_or_bottoms_only(prototxt):
    """pycaffe: forward(end=L) returns top_names[L] (+ blobs), backward(end=L) returns
    bottom_names[L] (+ diffs), not a blob that merely shares L's name."""
    net = caffe.Net(prototxt, caffe.TRAIN)
    net.blobs["data"].data[...] = 1.0
    net.forward()
    assert sorted(net.backward(end="ip2")) == ["ip1"]
    assert sorted(net.backward(start="loss", end="loss")) == ["ip2", "label"]
    assert sorted(net.forward(end="relu1", blobs=["data"])) == ["data", "ip1"]


def test_forward_backward_all_batches_and_drops_the_padding(tmp_path):
    """pycaffe's forward_backward_all over 7 samples in batches of 3 (the last padded)."""
    path = tmp_path / "forced.prototxt"
    path.write_text("force_backward: true\n" + NET)  # else Caffe computes no input diffs
    net = caffe.Net(str(path), caffe.TRAIN)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((7, 4)).astype(np.float32)
    label = rng.standard_normal((7, 2)).astype(np.float32)
    outs, diffs = net.forward_backward_all(data=x, label=label, blobs=["ip2"])
    assert set(outs) == {"loss", "ip2"} and set(diffs) == {"data", "label"}
    assert outs["ip2"].shape == (7, 2) and diffs["data"].shape == (7, 4)
    assert outs["loss"].shape == (3,)  # one loss per batch
    for first in (0, 3, 6):
        part = slice(first, first + 3)
        xs, ls = x[part], label[part]
        pad = 3 - len(xs)  # zeros, as pycaffe's Net._batch pads
        xs = np.concatenate([xs, np.zeros((pad, 4))]) if pad else xs
        ls = np.concatenate([ls, np.zeros((pad, 2))]) if pad else ls
        want = reference(net, xs.astype(np.float64), ls.astype(np.float64))
        np.testing.assert_allclose(outs["ip2"][part], want["y"][: 3 - pad], rtol=1e-5)
        np.testing.assert_allclose(outs["loss"][first // 3], want["loss"], rtol=1e-5)
        np.testing.assert_allclose(diffs["data"][part], want["dx"][: 3 - pad], rtol=1e-4, atol=1e-6)
    batches = list(net._batch({"data": x}))
    assert [b["data"].shape for b in batches] == [(3, 4)] * 3
    assert (batches[-1]["data"][1:] == 0).all()


def test_load_hdf5_and_the_index_lists(prototxt, tmp_path):
    net = caffe.Net(prototxt, caffe.TEST)
    net.save_hdf5(str(tmp_path / "w.h5"))
    net.save(str(tmp_path / "w.caffemodel"))
    other = caffe.Net(prototxt, caffe.TEST)
    other.load_hdf5(str(tmp_path / "w.h5"))
    np.testing.assert_array_equal(other.params["ip1"][0].data, net.params["ip1"][0].data)
    with pytest.raises(WeightsError, match="not an HDF5 weights file"):
        other.load_hdf5(str(tmp_path / "w.caffemodel"))
    assert [net._blob_names[i] for i in net._inputs] == net.inputs == ["data", "label"]
    assert [net._blob_names[i] for i in net._outputs] == net.outputs
    assert net._blobs[2] is net.blobs["ip1"]


TWO_AUTOMATIC = """
layer { name: "in" type: "Input" top: "a" top: "b" top: "c"
  input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 3 } shape { dim: 2 dim: 3 } } }
layer { name: "l1" type: "EuclideanLoss" bottom: "a" bottom: "b" }
layer { name: "l2" type: "EuclideanLoss" bottom: "a" bottom: "c" loss_weight: 3 }
"""


def test_automatic_tops_all_show_as_one_automatic_key_as_in_pycaffe(tmp_path):
    """Caffe's AppendTop names every automatic top "(automatic)"; pycaffe zips _blob_names
    into dicts, so net.blobs and blob_loss_weights hold one such key, at the first one's
    place, with the last one's blob and weight; top_names indexes blob ids into those
    keys, one short, and runs out at l2."""
    path = tmp_path / "two_losses.prototxt"
    path.write_text(TWO_AUTOMATIC)
    net = caffe.Net(str(path), caffe.TEST)
    assert net._blob_names.count("(automatic)") == 2
    assert net._blob_names[-2:] == ["(automatic)", "(automatic)"]
    assert list(net.blobs) == net._blob_names[:-1]
    assert net.blob_loss_weights["(automatic)"] == 3.0
    assert list(net.blob_loss_weights) == list(net.blobs)
    net.blobs["a"].data[...] = 1.0
    net.blobs["b"].data[...] = 0.0
    net.blobs["c"].data[...] = 3.0
    assert net.forward() == {}  # automatic tops are never net outputs
    first, last = net._blobs[-2], net._blobs[-1]
    assert net.blobs["(automatic)"] is last
    np.testing.assert_allclose(first.data, 6 / 4)  # sum((a - b)^2) / 2N
    np.testing.assert_allclose(last.data, 24 / 4)
    out = net.forward(blobs=["(automatic)"])
    assert list(out) == ["(automatic)"] and out["(automatic)"] == 6.0
    assert net.bottom_names["l2"] == ["a_in_0_split_1", "c"]  # ids before the repeat: unshifted
    with pytest.raises(IndexError):
        net.top_names  # noqa: B018  # pycaffe: l2's top id is past list(net.blobs)


DUMMY = """
layer { name: "d" type: "DummyData" top: "x" top: "label"
  dummy_data_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 1 }
    data_filler { type: "constant" value: 1 } data_filler { type: "constant" value: 0 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
  inner_product_param { num_output: 1 weight_filler { type: "constant" value: 1 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "label" top: "loss" }
"""


@pytest.mark.parametrize("phase", [caffe.TEST, caffe.TRAIN])
def test_a_constant_dummy_data_top_keeps_what_a_script_writes(tmp_path, phase):
    """Caffe's DummyData fills a constant top once, at setup: a deploy net fed through it
    (net.blobs['x'].data[...] = image; net.forward()) computes on the image."""
    path = tmp_path / "dummy.prototxt"
    path.write_text(DUMMY)
    net = caffe.Net(str(path), phase)
    np.testing.assert_array_equal(net.blobs["x"].data, np.ones((2, 3)))  # filled at setup
    net.blobs["x"].data[...] = [[1, 2, 3], [4, 5, 6]]
    out = net.forward()
    np.testing.assert_allclose(net.blobs["y"].data.ravel(), [6, 15])
    np.testing.assert_allclose(out["loss"], (36 + 225) / 4)
    if phase == caffe.TRAIN:
        net.forward_backward()  # the solver's one pass reads it too
        # dL/dy = (y - label) / 2 = [3, 7.5]; dW = dy^T x
        np.testing.assert_allclose(net.params["ip"][0].diff, [[33.0, 43.5, 54.0]])
    tnet = net.module  # the torch face fills it each call, as a module has no blob state
    np.testing.assert_allclose(tnet.forward_all_blobs()["y"].detach().numpy().ravel(), [3, 3])


def test_an_in_place_layer_on_a_constant_dummy_top_accumulates_as_in_caffe(tmp_path):
    path = tmp_path / "acc.prototxt"
    path.write_text(
        'layer { name: "d" type: "DummyData" top: "x" dummy_data_param { shape { dim: 3 }'
        ' data_filler { type: "constant" value: 1 } } }\n'
        'layer { name: "p" type: "Power" bottom: "x" top: "x" power_param { shift: 1 } }\n'
    )
    net = caffe.Net(str(path), caffe.TEST)
    seen = []
    for _ in range(3):
        net.forward()
        seen.append(float(net.blobs["x"].data[0]))
    assert seen == [2.0, 3.0, 4.0]


def test_per_layer_callbacks_see_every_layer_in_caffes_order(prototxt):
    """pycaffe's before_forward / after_forward / before_backward / after_backward: run(i)
    around layer i, for every layer of the range (Net::ForwardFromTo, BackwardFromTo); an
    after_forward callback reads that layer's tops already written."""
    net = caffe.Net(prototxt, caffe.TRAIN)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    label = rng.standard_normal((3, 2)).astype(np.float32)
    calls: list[tuple[str, int]] = []
    tops_seen: dict[int, np.ndarray] = {}
    net.before_forward(lambda i: calls.append(("bf", i)))
    net.after_forward(lambda i: calls.append(("af", i)))
    net.after_forward(
        lambda i: tops_seen.setdefault(
            i, net.blobs[net.top_names[net._layer_names[i]][0]].data.copy()
        )
    )
    net.before_backward(lambda i: calls.append(("bb", i)))
    net.after_backward(lambda i: calls.append(("ab", i)))
    out = net.forward(data=x, label=label)
    n = len(net.layers)
    assert calls == [(k, i) for i in range(n) for k in ("bf", "af")]
    want = reference(net, x.astype(np.float64), label.astype(np.float64))
    np.testing.assert_allclose(out["loss"], want["loss"], rtol=1e-5)
    np.testing.assert_allclose(tops_seen[3], want["y"], rtol=1e-5)  # ip2's top, right after it
    calls.clear()
    net.backward()
    assert calls == [(k, i) for i in reversed(range(n)) for k in ("bb", "ab")]
    np.testing.assert_allclose(net.params["ip1"][0].diff, want["dw1"], rtol=1e-4, atol=1e-6)
    calls.clear()
    net.clear_param_diffs()
    net.forward_backward()  # the solver's step: layer by layer too
    assert [k for k, _ in calls] == ["bf", "af"] * n + ["bb", "ab"] * n
    np.testing.assert_allclose(net.params["ip2"][0].diff, want["dw2"], rtol=1e-4, atol=1e-6)


def test_a_parameter_layers_diff_is_its_tops_so_backward_overwrites_it(tmp_path):
    """ParameterLayer::Forward shares its param's diff with its top: a second backward leaves
    the param diff as the top diff the consumer wrote, where other param diffs accumulate."""
    path = tmp_path / "param.prototxt"
    path.write_text(
        "force_backward: true\n"
        'layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 3 dim: 2 } } }\n'
        'layer { name: "p" type: "Parameter" top: "w" parameter_param { shape { dim: 2 } } }\n'
        'layer { name: "s" type: "Scale" bottom: "x" bottom: "w" top: "y" }\n'
    )
    net = caffe.Net(str(path), caffe.TEST)
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    net.blobs["x"].data[...] = x
    net.params["p"][0].data[...] = [2, 3]
    net.forward()
    net.blobs["y"].diff[...] = 1
    net.backward()
    net.backward()
    np.testing.assert_array_equal(net.params["p"][0].diff, x.sum(0))
    np.testing.assert_array_equal(net.blobs["w"].diff, x.sum(0))


def test_silence_backward_zeroes_its_bottoms_diff_under_force_backward(tmp_path):
    """SilenceLayer::Backward writes zeros into each bottom diff it propagates to."""
    path = tmp_path / "silence.prototxt"
    path.write_text(
        "force_backward: true\n"
        'layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }\n'
        'layer { name: "s" type: "Silence" bottom: "x" }\n'
    )
    net = caffe.Net(str(path), caffe.TEST)
    net.blobs["x"].data[...] = 1
    net.blobs["x"].diff[...] = 7
    net.forward()
    net.backward()
    assert not net.blobs["x"].diff.any()
