"""Convert between Caffe files and other formats (ONNX, safetensors, state_dict, Caffe).

torchcaffe convert NET.prototxt WEIGHTS.caffemodel --to onnx|safetensors|state_dict -o OUT
torchcaffe convert NET.prototxt WEIGHTS.{safetensors,pt,h5} --to caffe -o OUT.caffemodel
torchcaffe convert pkg.module:factory --to caffe --input-shape 1,3,224,224 -o OUT
    (a PyTorch model: ``factory()`` returns the nn.Module; writes OUT.prototxt + OUT.caffemodel)
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from ..errors import ExportError, TorchCaffeError

TARGETS = ("onnx", "safetensors", "state_dict", "caffe")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="NET.prototxt, or a PyTorch model as pkg.module:factory")
    p.add_argument("weights", nargs="?", help="weights for the prototxt (caffemodel, ...)")
    p.add_argument("--to", required=True, choices=TARGETS, help="target format")
    p.add_argument("-o", "--output", required=True, help="output file (caffe from PyTorch: prefix)")
    p.add_argument(
        "--onnx-exporter",
        default="dynamo",
        choices=["dynamo", "torchscript"],
        help="torch.onnx exporter (dynamo needs onnxscript)",
    )
    p.add_argument("--static-batch", action="store_true", help="ONNX: fixed batch size")
    p.add_argument("--outputs", help="ONNX: comma-separated blobs to export as outputs")
    p.add_argument(
        "--keys",
        default="readable",
        choices=["readable", "torchnet"],
        help="state_dict keys: conv1.weight (readable) or layers.conv1.weight (torchcaffe's)",
    )
    p.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="D0,D1,...",
        help="PyTorch source: example input shape (repeat for several inputs)",
    )
    p.add_argument("--strict-bvlc", action="store_true", help="PyTorch source: BVLC layers only")


def _is_factory(source: str) -> bool:
    return ":" in source and not os.path.exists(source)


def _factory_module(spec: str) -> torch.nn.Module:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ExportError("a PyTorch source is pkg.module:factory", got=spec)
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ExportError(f"cannot import {module_name!r}: {err}") from None
    finally:
        sys.path.pop(0)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ExportError(f"{module_name!r} has no attribute {attr!r}", got=spec)
        obj = getattr(obj, part)
    model = obj if isinstance(obj, torch.nn.Module) else obj()
    if not isinstance(model, torch.nn.Module):
        raise ExportError(
            f"{spec} did not give an nn.Module", expected="nn.Module", got=type(model).__name__
        )
    return model


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.split(","))
    except ValueError:
        raise ExportError("bad --input-shape", expected="D0,D1,... integers", got=text) from None
    if not dims or min(dims) <= 0:
        raise ExportError("bad --input-shape", expected="positive dims", got=text)
    return dims


def _prefix(output: str) -> str:
    path = Path(output)
    return str(path.with_suffix("")) if path.suffix in (".prototxt", ".caffemodel") else output


def main(args: argparse.Namespace) -> int:
    with tqdm(total=3, desc=f"convert -> {args.to}", unit="step", disable=None) as bar:
        written = _convert(args, bar)
    for path in written:
        print(f"wrote {path} ({os.path.getsize(path)} bytes)")
    return 0


def _convert(args: argparse.Namespace, bar: tqdm) -> list[str]:
    if _is_factory(args.source):
        if args.to != "caffe":
            raise ExportError(
                f"a PyTorch model converts --to caffe only, not {args.to}",
                hint="for ONNX use torch.onnx.export on the model itself",
            )
        return _from_pytorch(args, bar)
    if args.weights is None and args.to != "onnx":
        raise TorchCaffeError(f"--to {args.to} needs a weights file after the prototxt")
    from ..api import load, save_weights
    from ..converters import (
        caffemodel_to_safetensors,
        caffemodel_to_state_dict,
        safetensors_to_caffemodel,
        state_dict_to_caffemodel,
    )

    bar.update(1)
    if args.to == "onnx":
        from ..converters.onnx import export_onnx

        net = load(args.source, args.weights)
        bar.update(1)
        outputs = args.outputs.split(",") if args.outputs else None
        export_onnx(
            net,
            args.output,
            dynamo=args.onnx_exporter == "dynamo",
            dynamic_batch=not args.static_batch,
            outputs=outputs,
        )
    elif args.to == "safetensors":
        caffemodel_to_safetensors(args.source, args.weights, args.output)
    elif args.to == "state_dict":
        readable = args.keys == "readable"
        caffemodel_to_state_dict(args.source, args.weights, args.output, readable=readable)
    else:
        suffix = Path(args.weights).suffix.lower()
        if suffix == ".safetensors":
            safetensors_to_caffemodel(args.source, args.weights, args.output)
        elif suffix in (".pt", ".pth", ".bin", ".ckpt"):
            state_dict_to_caffemodel(args.source, args.weights, args.output)
        else:  # caffemodel or HDF5: rewrite as a current binary caffemodel
            save_weights(load(args.source, args.weights), args.output, hdf5=False)
    bar.update(bar.total - bar.n)
    return [args.output]


def _from_pytorch(args: argparse.Namespace, bar: tqdm) -> list[str]:
    from ..converters.torch_to_caffe import export

    if not args.input_shape:
        raise ExportError(
            "a PyTorch model needs --input-shape D0,D1,... (the example input)",
            hint="e.g. --input-shape 1,3,224,224",
        )
    model = _factory_module(args.source)
    bar.update(1)
    inputs = [torch.rand(_shape(s)) for s in args.input_shape]
    prefix = _prefix(args.output)
    proto, weights = prefix + ".prototxt", prefix + ".caffemodel"
    export(model, inputs, proto, weights, strict_bvlc=args.strict_bvlc)
    bar.update(2)
    return [proto, weights]
