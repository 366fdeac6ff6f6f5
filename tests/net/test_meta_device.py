"""Device discipline without a GPU: nets run on the "meta" device, where any host tensor an
op builds and mixes into the computation fails ("expected all tensors to be on the same
device"), as it would on CUDA. Values are meaningless there; only the devices are checked.

Covered: the torch face (forward and backward, passes on and off, TRAIN and TEST) on random
nets and three zoo deploy nets, and the Caffe face in GPU mode (the compute device and
SyncedMemory's device side patched to meta) through solver steps of every type, forward,
backward, partial passes, a reshape and a param edit. Meta has no values, so the host-side
reads a real device would answer (a loss's ``float()``, ``torch.equal``, device -> host
copies) are answered with zeros here.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from google.protobuf import text_format

import torchcaffe
import torchcaffe as caffe
from torchcaffe.proto import caffe_pb2

from .random_nets import random_net, random_training_net

META = torch.device("meta")
ZOO = [
    "bvlc_googlenet/deploy.prototxt",
    "resnet50_kaiminghe/ResNet-50-deploy.prototxt",
    "mobilenet_v2/mobilenet_v2_deploy.prototxt",
]
SOLVER_TYPES = ["SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam"]


def _net(text: str, phase: str) -> torchcaffe.TorchNet:
    return torchcaffe.load(text_format.Parse(text, caffe_pb2.NetParameter()), phase=phase)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("phase", ["train", "test"])
def test_random_net_runs_forward_and_backward_on_meta(seed, phase):
    net = _net(random_training_net(seed), phase).to(META)
    x = torch.empty(random_net(seed, batch=4).input_shape, device=META, requires_grad=True)
    for optimize in (True, False):
        net.optimize = optimize
        blobs = net.forward_all_blobs(data=x)
        assert all(t.device == META for t in blobs.values())
        net.total_loss(blobs).backward()
    assert all(p.grad is None or p.grad.device == META for p in net.parameters())


@pytest.mark.parametrize("proto", ZOO)
def test_zoo_deploy_net_runs_on_meta(models_root, proto):
    net = torchcaffe.load(str(models_root / proto), phase="test").to(META)
    inputs = {n: torch.empty(net.blob_shapes[n], device=META) for n in net.input_names}
    for optimize in (True, False):
        net.optimize = optimize
        with torch.no_grad():
            out = net(**inputs)
        assert all(t.device == META for t in out.values())


@pytest.mark.parametrize("seed", range(6))
def test_caffe_face_in_gpu_mode_keeps_every_tensor_on_the_device(meta_gpu_mode, seed):
    param = caffe_pb2.SolverParameter(
        type=SOLVER_TYPES[seed], base_lr=0.01, lr_policy="fixed", weight_decay=5e-4
    )
    param.momentum = 0.0 if param.type in ("AdaGrad", "RMSProp") else 0.9
    param.iter_size = 2 if seed % 3 == 0 else 1
    param.clip_gradients = 1.0 if seed % 2 else -1.0
    param.max_iter, param.display, param.snapshot = 100, 0, 0
    param.snapshot_after_train = False
    param.net_param.CopyFrom(text_format.Parse(random_training_net(seed), caffe_pb2.NetParameter()))
    solver = caffe.get_solver(param)
    net = solver.net
    shape = net.blobs["data"].shape
    for _ in range(2):
        net.blobs["data"].data[...] = np.ones(shape, np.float32)
        solver.step(1)
    assert all(p.device == META for p in net.module.parameters())
    for blob in net.blobs.values():  # reading the host side copies from the device side
        assert blob.data.shape == blob.diff.shape == blob.shape
    net.forward()
    net.backward()
    names = list(net.layer_dict)
    middle = names[len(names) // 2]
    net.forward(start=middle)
    net.backward(end=middle)
    net.blobs["data"].reshape(2, *shape[1:])
    net.reshape()
    net.forward()
    next(iter(net.params.values()))[0].data[...] += 1  # an edit on the host side
    solver.step(1)
    assert all(p.device == META for p in net.module.parameters())


FOLDED_TRAINING = """
input: "data" input_shape { dim: 2 dim: 3 dim: 8 dim: 8 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 4 kernel_size: 3 bias_term: false } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c"
  batch_norm_param { use_global_stats: true } }
layer { name: "sc" type: "Scale" bottom: "c" top: "c" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }
"""


def _compiled_training_graphs(net: torchcaffe.TorchNet) -> list[torch.fx.GraphModule]:
    """Dynamo's graphs of a compiled forward+backward of ``net`` on meta, run whole."""
    graphs: list[torch.fx.GraphModule] = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(net, backend=record, fullgraph=True)(
        data=torch.empty(2, 3, 8, 8, device=META)
    )
    out["c"].sum().backward()
    assert all(p.grad is not None and p.grad.device == META for p in net.parameters())
    return graphs


def test_compiled_training_off_the_cpu_runs_batch_norm_after_the_convolution():
    """Off the CPU a frozen BatchNorm fold traced for training is the convolution with its
    weight as it is, then one batch norm, as in a hand-written model: the differentiable
    fold's weight and per-channel arithmetic would be kernels of their own each way."""
    net = _net(FOLDED_TRAINING, "test").to(META)
    assert net.training_program().report["fold_frozen_batchnorm_for_training"] == 1
    (graph,) = _compiled_training_graphs(net)
    calls = [n for n in graph.graph.nodes if n.op == "call_function"]
    convs = [n for n in calls if n.target is torch.conv2d]
    assert len(convs) == 1 and convs[0].args[1].op == "placeholder"  # the weight unscaled
    assert [n for n in calls if n.target is torch.nn.functional.batch_norm]
    assert not [n for n in calls if n.target is torch.stack]
