"""torchcaffe: Caffe nets compiled onto PyTorch.

Torch face::

    net = torchcaffe.load("deploy.prototxt", "weights.caffemodel", phase="test")
    out = net(data=x)            # {output blob name: tensor}

Caffe face (pycaffe names)::

    import torchcaffe as caffe
    net = caffe.Net("deploy.prototxt", "weights.caffemodel", caffe.TEST)
    net.blobs["data"].data[...] = arr; net.forward()
"""

from __future__ import annotations

from . import coord_map, draw, io, layers, limits, net_spec, params, proto
from .api import load, load_weights, save_weights
from .blob import Blob
from .caffe_alias import install_caffe_alias
from .classifier import Classifier
from .converters.torch_to_caffe import export
from .detector import Detector
from .errors import (
    BlobWiringError,
    DataError,
    DeviceError,
    ExportError,
    LayerParamError,
    PartialWeightsWarning,
    PrototxtError,
    SolverError,
    TorchCaffeError,
    TracedStateWarning,
    TrustError,
    UnknownLayerTypeError,
    UnsupportedError,
    WeightsError,
)
from .net.net import TorchNet
from .net.state import Phase
from .net_spec import NetSpec, to_proto
from .ops._python_substitutes import NativeSubstituteWarning
from .ops.base import CaffeLayer
from .precision import caffe_float32
from .proto import caffe_pb2
from .pycaffe.layer import Layer
from .pycaffe.net import Net
from .pycaffe.process import NCCL, Timer, has_nccl, init_log, log
from .pycaffe.solver import (
    AdaDeltaSolver,
    AdaGradSolver,
    AdamSolver,
    NesterovSolver,
    RMSPropSolver,
    SGDSolver,
    get_solver,
)
from .registry import layer_type_list, register_layer
from .runtime import (
    set_device,
    set_mode_cpu,
    set_mode_gpu,
    set_multiprocess,
    set_random_seed,
    set_solver_count,
    set_solver_rank,
    solver_count,
    solver_rank,
)
from .solver.param_groups import param_groups

TRAIN = Phase(caffe_pb2.TRAIN)
TEST = Phase(caffe_pb2.TEST)

__version__ = "0.1.0"

__all__ = [
    "load",
    "load_weights",
    "export",
    "ExportError",
    "save_weights",
    "param_groups",
    "caffe_float32",
    "Net",
    "Layer",
    "TorchNet",
    "Blob",
    "CaffeLayer",
    "TRAIN",
    "TEST",
    "proto",
    "limits",
    "io",
    "coord_map",
    "draw",
    "layers",
    "params",
    "net_spec",
    "NetSpec",
    "Classifier",
    "Detector",
    "install_caffe_alias",
    "to_proto",
    "caffe_pb2",
    "layer_type_list",
    "register_layer",
    "set_mode_cpu",
    "set_mode_gpu",
    "set_device",
    "set_random_seed",
    "solver_count",
    "set_solver_count",
    "solver_rank",
    "set_solver_rank",
    "set_multiprocess",
    "init_log",
    "log",
    "Timer",
    "NCCL",
    "has_nccl",
    "TorchCaffeError",
    "PrototxtError",
    "UnknownLayerTypeError",
    "LayerParamError",
    "BlobWiringError",
    "WeightsError",
    "UnsupportedError",
    "SolverError",
    "DataError",
    "DeviceError",
    "TrustError",
    "PartialWeightsWarning",
    "TracedStateWarning",
    "NativeSubstituteWarning",
    "SGDSolver",
    "NesterovSolver",
    "AdaGradSolver",
    "RMSPropSolver",
    "AdaDeltaSolver",
    "AdamSolver",
    "get_solver",
]
