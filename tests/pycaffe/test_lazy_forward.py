"""The Caffe face's forward runs the torch face's program and writes blobs when read.

Whatever a pycaffe script observes must still be Caffe's: every blob's value (folded ones are
computed on demand), numpy views taken before ``forward()``, the returned outputs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchcaffe as caffe
from torchcaffe import syncedmem
from torchcaffe.pycaffe.lazy_forward import replayable

from ..helpers.params import fill_params

FOLD = "fold_batchnorm_scale_into_producer"
RTOL, ATOL = 1e-4, 1e-5  # the golden tolerance of the folds (tests/net/test_passes.py)

# MobileNetV2's pattern: conv -> c, BatchNorm c -> b, Scale and ReLU in place on b.
NET = """
name: "lazy"
input: "data" input_shape { dim: 2 dim: 3 dim: 6 dim: 5 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "b" }
layer { name: "sc" type: "Scale" bottom: "b" top: "b" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "b" top: "b" }
layer { name: "ip" type: "InnerProduct" bottom: "b" top: "f" inner_product_param { num_output: 3 } }
layer { name: "prob" type: "Softmax" bottom: "f" top: "prob" }
"""


@pytest.fixture
def net(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    net = caffe.Net(str(path), caffe.TEST)
    fill_params(net.module, lambda t, gen: torch.rand(t.shape, generator=gen) * 1.5 + 0.25)
    return net


@pytest.fixture
def fills():
    seen: list[syncedmem.SyncedMemory] = []

    def hook(mem, direction):
        if direction == "deferred":
            seen.append(mem)

    syncedmem.copy_hooks.append(hook)
    yield seen
    syncedmem.copy_hooks.remove(hook)


def _x(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, 3, 6, 5)).astype(np.float32)


def _caffe_values(net, x: np.ndarray) -> dict[str, np.ndarray]:
    """Caffe's value of every blob: the literal layer-by-layer program."""
    module = net.module
    module.optimize = False
    try:
        with torch.no_grad():
            out = module.forward_all_blobs(data=torch.from_numpy(x))
    finally:
        module.optimize = True
    return {k: v.numpy() for k, v in out.items()}


def test_forward_runs_the_torch_face_program_with_its_values(net):
    x = _x(0)
    assert replayable(net.module)
    net.blobs["data"].data[...] = x
    out = net.forward()
    assert net._lazy.last_program is net.module.optimized_program()  # outputs only
    assert net._lazy.last_program.report[FOLD] == 1  # c is not materialized
    with torch.inference_mode():
        want = net.module(data=torch.from_numpy(x))["prob"]
    np.testing.assert_array_equal(out["prob"], want.numpy())
    assert not net.blobs["prob"].data_at(torch.device("cpu")).is_inference()


def test_forward_names_its_device_instead_of_walking_the_params(net, monkeypatch):
    # the program for the device the face computes on; finding it from the params cost a
    # GPU run ~0.1 ms of host time per forward
    net.blobs["data"].data[...] = _x(0)
    net.forward()
    walks = []
    params = type(net.module).parameters
    monkeypatch.setattr(
        type(net.module), "parameters", lambda self, *a: walks.append(1) or params(self, *a)
    )
    net.forward()
    assert walks == []


def test_blobs_nobody_reads_are_never_copied(net, fills):
    net.blobs["data"].data[...] = _x(0)
    net.forward()  # returns a view of prob: its one copy
    assert fills == [net.blobs["prob"].data_memory]
    assert all(net.blobs[n].data_memory.deferred for n in ("c", "b", "f"))
    assert net._lazy.replays == 0


def test_a_folded_blob_read_on_demand_is_caffes_and_then_observed(net):
    x = _x(1)
    net.blobs["data"].data[...] = x
    net.forward()
    want = _caffe_values(net, x)
    for name in ("c", "b", "f", "prob"):
        np.testing.assert_allclose(net.blobs[name].data, want[name], rtol=RTOL, atol=ATOL)
    assert net._lazy.replays == 1  # one recompute served every left-out blob
    y = _x(2)
    net.blobs["data"].data[...] = y
    net.forward()  # the script reads c: this program keeps it
    assert net._lazy.last_program.report[FOLD] == 0
    np.testing.assert_allclose(
        net.blobs["c"].data, _caffe_values(net, y)["c"], rtol=RTOL, atol=ATOL
    )
    assert net._lazy.replays == 1
    net.forward()  # c was read after the last forward: still kept
    assert net._lazy.last_program.report[FOLD] == 0
    net.forward()  # not read since: folded again
    assert net._lazy.last_program.report[FOLD] == 1


def test_views_taken_before_forward_show_the_new_values(net):
    prob, c = net.blobs["prob"].data, net.blobs["c"].data[0]
    for seed in (3, 4):
        x = _x(seed)
        net.blobs["data"].data[...] = x
        net.forward()
        want = _caffe_values(net, x)
        np.testing.assert_allclose(prob, want["prob"], rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(c, want["c"][0], rtol=RTOL, atol=ATOL)
    assert net._lazy.replays == 0  # both were in the program


def test_inputs_edited_after_forward_do_not_change_unread_blobs(net):
    x = _x(5)
    net.blobs["data"].data[...] = x
    net.forward()
    net.blobs["data"].data[...] = _x(6)  # no forward: Caffe's blobs still hold x's values
    want = _caffe_values(net, x)
    for name in ("c", "b", "prob"):
        np.testing.assert_allclose(net.blobs[name].data, want[name], rtol=RTOL, atol=ATOL)


def test_forward_blobs_argument_and_kwargs(net):
    x = _x(7)
    out = net.forward(blobs=["c"], data=x)
    assert set(out) == {"prob", "c"}
    assert net._lazy.replays == 0  # c was in the program
    np.testing.assert_allclose(out["c"], _caffe_values(net, x)["c"], rtol=RTOL, atol=ATOL)


def test_new_input_shape_reshapes_every_blob(net):
    x = np.random.default_rng(8).standard_normal((3, 3, 10, 3)).astype(np.float32)
    net.blobs["data"].reshape(*x.shape)
    net.blobs["data"].data[...] = x
    net.forward()
    want = _caffe_values(net, x)
    for name, value in want.items():
        assert net.blobs[name].shape == value.shape
        np.testing.assert_allclose(net.blobs[name].data, value, rtol=RTOL, atol=ATOL)


def test_partial_forward_after_a_lazy_one(net):
    x = _x(9)
    net.blobs["data"].data[...] = x
    net.forward()
    net.forward(start="ip")  # reads b (deferred: recomputed), writes f and prob
    want = _caffe_values(net, x)
    for name in ("b", "f", "prob"):
        np.testing.assert_allclose(net.blobs[name].data, want[name], rtol=RTOL, atol=ATOL)


def test_nets_with_effects_take_the_eager_path(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text("""
layer { name: "data" type: "DummyData" top: "data"
  dummy_data_param { shape { dim: 2 dim: 3 } data_filler { type: "gaussian" } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "f"
  inner_product_param { num_output: 2 } }
""")
    net = caffe.Net(str(path), caffe.TEST)
    assert not replayable(net.module)  # recomputing would draw a new batch
    net.forward()
    assert net._lazy.last_program is None
    assert not any(b.data_memory.deferred for b in net.blobs.values())
    data = net.blobs["data"].data.copy()
    w, b = (p.data for p in net.params["ip"])
    np.testing.assert_allclose(net.blobs["f"].data, data @ w.T + b, rtol=1e-5, atol=1e-6)


def test_a_param_written_after_forward_leaves_the_blobs_as_caffe_computed_them(net):
    x = _x(10)
    net.blobs["data"].data[...] = x
    net.forward()
    want = _caffe_values(net, x)
    net.params["conv"][0].data[...] *= 2.0  # net surgery before reading a folded blob
    assert net._lazy.replays == 1  # recomputed with the forward's weights first
    for name in ("c", "b", "f"):
        np.testing.assert_allclose(net.blobs[name].data, want[name], rtol=RTOL, atol=ATOL)


def test_a_param_view_held_across_forward_leaves_the_blobs_as_caffe_computed_them(net):
    """A write through a numpy view taken before ``forward()`` reaches no ``settle``: the
    forward must not leave blobs to a replay that would read the new weights."""
    weight = net.params["conv"][0].data  # held across the forward, as a surgery loop does
    x = _x(12)
    net.blobs["data"].data[...] = x
    net.forward()
    want = _caffe_values(net, x)
    weight[...] *= 2.0
    for name in ("c", "b", "f", "prob"):
        np.testing.assert_allclose(net.blobs[name].data, want[name], rtol=RTOL, atol=ATOL)
    del weight  # no view left: the next forward defers again
    net._lazy.last_program = None
    net.forward()
    assert net._lazy.last_program is not None
    want = _caffe_values(net, x)
    for name in ("c", "b", "f", "prob"):
        np.testing.assert_allclose(net.blobs[name].data, want[name], rtol=RTOL, atol=ATOL)


def test_nets_sharing_params_take_the_eager_path(net, tmp_path):
    path = tmp_path / "other.prototxt"
    path.write_text(NET)
    other = caffe.Net(str(path), caffe.TEST)
    other.share_with(net)
    for n in (net, other):
        n.blobs["data"].data[...] = _x(11)
        n.forward()
        assert n._lazy.last_program is None
        assert not any(b.data_memory.deferred for b in n.blobs.values())


@pytest.mark.parametrize("name", ["MobileNetV2", "GoogLeNet"])
def test_real_deploy_net_every_blob_is_caffes(models_root, name):
    """The issue-14 nets: the outputs are the torch face's, bit for bit; every blob read
    afterwards (folded ones recomputed) is the literal program's."""
    from benchmarks.bench_caffe_face import caffe_face

    net, x, out = caffe_face(name, 1)
    net.blobs["data"].data[...] = x.numpy()
    got = net.forward()[out]
    assert sum(net._lazy.last_program.report.values()) > 0
    with torch.inference_mode():
        np.testing.assert_array_equal(got, net.module(data=x)[out].numpy())
    want = _caffe_values(net, x.numpy())
    np.testing.assert_allclose(got, want[out], rtol=RTOL, atol=ATOL)  # the folds' rounding
    for blob, value in want.items():  # recomputed by the literal program: exactly Caffe's
        if blob != out:
            np.testing.assert_array_equal(net.blobs[blob].data, value, err_msg=blob)
    assert net._lazy.replays == 1


def test_shapes_are_checked_once_per_input_shape(net, monkeypatch):
    calls = []
    infer = net.module.infer_shapes
    monkeypatch.setattr(net.module, "infer_shapes", lambda s: calls.append(s) or infer(s))
    for _ in range(3):
        net.forward(data=_x(12))
    assert len(calls) == 1
    net.blobs["data"].reshape(1, 3, 6, 5)
    net.forward(data=_x(12)[:1])
    assert len(calls) == 2 and net.blobs["prob"].shape == (1, 3)


@pytest.mark.parametrize("lazy", [True, False])
def test_a_layer_in_place_on_the_input_leaves_its_top_there_as_caffe_does(tmp_path, lazy):
    """Caffe's in-place layer writes the input Blob itself: after forward() the input holds
    the layer's top, and a second forward() over it scales the data again."""
    stats = "" if lazy else "batch_norm_param { use_global_stats: false }"
    path = tmp_path / "net.prototxt"
    path.write_text(f"""
input: "data" input_shape {{ dim: 2 dim: 3 dim: 4 dim: 4 }}
layer {{ name: "scale" type: "Power" bottom: "data" top: "data" power_param {{ scale: 2 }} }}
layer {{ name: "conv" type: "Convolution" bottom: "data" top: "c"
  convolution_param {{ num_output: 2 kernel_size: 1 }} }}
layer {{ name: "bn" type: "BatchNorm" bottom: "c" top: "b" {stats} }}
""")
    net = caffe.Net(str(path), caffe.TEST)
    fill_params(net.module, lambda t, gen: torch.rand(t.shape, generator=gen) + 0.5)
    assert replayable(net.module) is lazy
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
    net.blobs["data"].data[...] = x
    for times in (2, 4):
        net.forward()
        np.testing.assert_allclose(net.blobs["data"].data, times * x, rtol=1e-6)
        want = _caffe_values(net, times // 2 * x)
        np.testing.assert_allclose(net.blobs["c"].data, want["c"], rtol=RTOL, atol=ATOL)


def _assert_caffes(net, x: np.ndarray, names=("c", "b", "f", "prob")) -> None:
    want = _caffe_values(net, x)
    for name in names:
        assert net.blobs[name].shape == want[name].shape, name
        np.testing.assert_allclose(net.blobs[name].data, want[name], rtol=RTOL, atol=ATOL)


def test_a_repeated_forward_defers_every_blob_at_once(net, monkeypatch):
    """Same input shape, blobs untouched: one advance of the bulk deferral, no per-blob call
    (the per-blob walk was most of the Caffe face's own work: 140 blobs in MobileNetV2)."""
    net.forward(data=_x(20))
    calls = []
    for method in ("link", "defer", "viewed"):
        original = getattr(syncedmem.SyncedMemory, method)
        monkeypatch.setattr(
            syncedmem.SyncedMemory,
            method,
            lambda self, *a, _m=method, _o=original, **k: calls.append(_m) or _o(self, *a, **k),
        )
    generation = net._lazy._bulk.generation
    net.forward(data=_x(21))
    assert net._lazy._bulk.generation == generation + 1
    assert calls.count("link") == 0 and calls.count("defer") == 0
    assert calls.count("viewed") <= 2  # the memories accessed since: data's and prob's
    _assert_caffes(net, _x(21))


def test_a_view_taken_between_forwards_shows_the_next_one(net):
    net.forward(data=_x(22))
    view = net.blobs["b"].data  # after the blobs were linked: an access notes it
    net.forward(data=_x(23))
    np.testing.assert_allclose(view, _caffe_values(net, _x(23))["b"], rtol=RTOL, atol=ATOL)
    del view
    net.forward(data=_x(24))
    net.forward(data=_x(25))  # the view is gone: b waits to be read again
    assert net.blobs["b"].data_memory.deferred
    _assert_caffes(net, _x(25))


def test_a_blob_written_after_forward_keeps_the_write_until_the_next(net):
    net.forward(data=_x(26))
    net.blobs["c"].data[...] = 7.0  # no read first: the write is newer than the forward
    assert (net.blobs["c"].data == 7.0).all()
    net.forward(data=_x(27))
    _assert_caffes(net, _x(27))


@pytest.mark.parametrize("shape", [(1, 3), (4, 3, 2)], ids=["within", "past_capacity"])
def test_a_blob_reshaped_between_forwards_gets_its_shape_back(net, shape):
    net.forward(data=_x(28))
    memory = net.blobs["f"].data_memory
    net.blobs["f"].reshape(*shape)
    assert (net.blobs["f"].data_memory is memory) == (shape == (1, 3))
    net.forward(data=_x(29))
    _assert_caffes(net, _x(29))
    net.forward(data=_x(30))  # linked again with the blob's new memory
    _assert_caffes(net, _x(30))


def test_a_blob_sharing_another_blobs_memory_gets_the_forward(net):
    net.forward(data=_x(31))
    other = caffe.Blob((2, 3))
    net.blobs["f"].share_data(other)
    for seed in (32, 33):
        net.forward(data=_x(seed))
        np.testing.assert_allclose(
            other.data, _caffe_values(net, _x(seed))["f"], rtol=RTOL, atol=ATOL
        )


FILTER_NET = """
input: "data" input_shape { dim: 4 dim: 3 }
input: "sel" input_shape { dim: 4 }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "f"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }
layer { name: "filt" type: "Filter" bottom: "f" bottom: "sel" top: "kept" }
layer { name: "abs" type: "AbsVal" bottom: "kept" top: "out" }
"""


def test_blobs_whose_shape_the_data_decides_get_the_runs_shape(tmp_path):
    """A Filter's top (and what follows it) has as many rows as the selector keeps: Caffe
    reshapes it in Forward. Inferred shapes cannot know that, so those blobs are always
    kept, read or not; a forward whose kept shapes differ from the last walks every blob."""
    path = tmp_path / "filter.prototxt"
    path.write_text(FILTER_NET)
    net = caffe.Net(str(path), caffe.TEST)
    assert replayable(net.module)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    for sel in ([1, 1, 1, 1], [1, 0, 1, 0], [0, 1, 1, 1], [0, 1, 1, 1]):
        selector = np.array(sel, np.float32)
        net.forward(data=x, sel=np.ones(4, np.float32))  # no blob read after: none kept
        net.forward(data=x, sel=selector)
        module = net.module
        module.optimize = False
        with torch.no_grad():
            want = module.forward_all_blobs(
                data=torch.from_numpy(x), sel=torch.from_numpy(selector)
            )
        module.optimize = True
        for name in ("f", "kept", "out"):
            assert net.blobs[name].shape == tuple(want[name].shape), (sel, name)
            np.testing.assert_array_equal(net.blobs[name].data, want[name].numpy())


def test_a_blob_given_an_external_buffer_between_forwards_gets_the_next(net):
    big = np.random.default_rng(34).standard_normal((3, 3, 6, 5)).astype(np.float32)
    net.blobs["data"].reshape(*big.shape)
    net.forward(data=big)
    net.blobs["data"].reshape(2, 3, 6, 5)
    net.forward(data=_x(35))  # f keeps its 3-row capacity
    memory = net.blobs["f"].data_memory
    net.blobs["f"].set_cpu_data(torch.zeros(6))  # a buffer of its size: a new memory
    assert net.blobs["f"].data_memory is not memory
    net.forward(data=_x(36))
    _assert_caffes(net, _x(36))


def test_a_blob_only_looked_at_does_not_keep_an_old_run_alive(net):
    """A head read catches a blob up to its forward without writing it; after the next
    forward nothing may still hold the old run (its tensors, and a replay's every blob)."""
    import gc
    import weakref

    net.forward(data=_x(37))
    _ = net.blobs["c"].data  # a folded blob: this run replays, holding every blob's tensor
    net.forward(data=_x(38))
    old = weakref.ref(net._lazy._run)
    assert net.blobs["b"].data_memory.head is not None  # caught up, not written
    net.forward(data=_x(39))
    gc.collect()
    assert old() is None
    _assert_caffes(net, _x(39))


LSTM_NET = """
layer { name: "in" type: "Input" top: "x" top: "cont"
  input_param { shape { dim: 1 dim: 2 dim: 3 } shape { dim: 1 dim: 2 } } }
layer { name: "lstm" type: "LSTM" bottom: "x" bottom: "cont" top: "h"
  recurrent_param { num_output: 4 weight_filler { type: "uniform" min: -0.5 max: 0.5 }
                    bias_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layer { name: "ip" type: "InnerProduct" bottom: "h" top: "ip" inner_product_param {
  num_output: 5 axis: 2 weight_filler { type: "uniform" min: -1 max: 1 } } }
layer { name: "sc" type: "Scale" bottom: "ip" top: "sc" scale_param { axis: 2 bias_term: true
  filler { type: "uniform" min: 1 max: 2 } bias_filler { type: "uniform" min: -1 max: 1 } } }
"""


def test_a_recurrent_layers_carried_state_advances_once_per_forward(tmp_path):
    """Reading a folded blob must not run the LSTM again: its state would advance twice."""
    path = tmp_path / "net.prototxt"
    path.write_text(LSTM_NET)
    net, ref = caffe.Net(str(path), caffe.TEST), caffe.Net(str(path), caffe.TEST)
    assert not replayable(net.module)
    for name in net.params:
        for p, q in zip(net.params[name], ref.params[name]):
            q.data[...] = p.data
    rng = np.random.default_rng(0)
    for step in range(4):
        x = rng.standard_normal((1, 2, 3)).astype(np.float32)
        cont = np.ones((1, 2), np.float32)
        got = net.forward(x=x, cont=cont)["sc"].copy()
        want = ref.forward(["ip"], x=x, cont=cont)
        np.testing.assert_allclose(got, want["sc"], rtol=1e-5, atol=1e-6)
        if step == 2:  # a folded blob, read after the forward
            np.testing.assert_allclose(net.blobs["ip"].data, want["ip"], rtol=1e-5, atol=1e-6)


def test_on_a_device_the_input_a_script_wrote_is_copied_there_once(net, meta_gpu_mode):
    """GPU mode: the host data a script just wrote goes to the device in one copy, a tensor
    of the run's own; the blob's device side is left stale (its head says so) instead of
    being synced and then cloned."""
    copies: list[tuple[syncedmem.SyncedMemory, str]] = []
    syncedmem.copy_hooks.append(lambda memory, direction: copies.append((memory, direction)))
    try:
        for seed in range(2):
            net.blobs["data"].data[...] = _x(seed)
            memory = net.blobs["data"].data_memory
            copies.clear()
            out = net.forward()
            assert [d for m, d in copies if m is memory] == []
            assert memory.head is syncedmem.Head.HEAD_AT_CPU  # the host side is current
            assert out["prob"].shape == (2, 3)
        assert net._lazy._run is not None
        assert net._lazy._run.inputs["data"].device.type == "meta"
    finally:
        syncedmem.copy_hooks.pop()


def test_on_a_device_a_held_output_gets_the_next_value_in_one_copy(net, meta_gpu_mode):
    """GPU mode, the loop ``out = net.forward()`` holding the last outputs: each forward
    writes the held blob once on the device (its view waits for the sync, as pycaffe's
    does), not after first writing its deferred value or its host side there, and
    returning it takes one copy to the host."""
    copies: list[tuple[syncedmem.SyncedMemory, str]] = []
    syncedmem.copy_hooks.append(lambda memory, direction: copies.append((memory, direction)))
    try:
        out = net.forward()
        for seed in range(3):
            net.blobs["data"].data[...] = _x(seed)
            memory = net.blobs["prob"].data_memory
            copies.clear()
            out = net.forward()  # the last forward's arrays are alive meanwhile
            assert [d for m, d in copies if m is memory] == ["gpu->cpu"]
            assert out["prob"].shape == (2, 3)
    finally:
        syncedmem.copy_hooks.pop()
