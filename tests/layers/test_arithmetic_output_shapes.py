"""Layers whose output_shapes is arithmetic (not the meta-tensor forward) agree with it and
with a real forward, and building a deploy net imports none of torch's symbolic machinery."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from google.protobuf import text_format

from torchcaffe.ops.base import CaffeLayer
from torchcaffe.proto import caffe_pb2
from torchcaffe.registry import layer_class

SHAPE_CASES = [
    ('type: "Pooling" pooling_param { pool: MAX kernel_size: 3 stride: 2 }', 2, (2, 5, 13, 11)),
    (
        'type: "Pooling" pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 }',
        1,
        (1, 3, 7, 8),
    ),
    ('type: "Pooling" pooling_param { pool: MAX global_pooling: true }', 1, (2, 4, 5, 6)),
    (
        'type: "Pooling" pooling_param { pool: MAX kernel_size: 2 stride: 2 round_mode: FLOOR }',
        1,
        (1, 2, 7, 7),
    ),
    ('type: "Softmax" softmax_param { axis: -1 }', 1, (2, 3, 4)),
    ('type: "Softmax"', 1, (5, 10)),
    ('type: "Split"', 3, (2, 3, 4, 5)),
]


@pytest.mark.parametrize("text,tops,shape", SHAPE_CASES)
def test_output_shapes_match_the_meta_forward_and_a_real_one(text, tops, shape):
    lp = text_format.Parse(f'name: "l" bottom: "x" {text}', caffe_pb2.LayerParameter())
    lp.top.extend([f"t{i}" for i in range(tops)])
    layer = layer_class(lp.type)(lp, [shape])
    got = layer.output_shapes([shape])
    assert got == CaffeLayer.output_shapes(layer, [shape])
    with torch.no_grad():
        out = layer(torch.rand(shape))
    outs = out if isinstance(out, tuple) else (out,)
    assert got == [tuple(t.shape) for t in outs]


def test_building_a_deploy_net_does_not_import_sympy(models_root):
    proto = models_root / "resnet50_kaiminghe" / "ResNet-50-deploy.prototxt"
    code = (
        "import sys, torchcaffe\n"
        f"torchcaffe.load({str(proto)!r}, phase='test')\n"
        "print('sympy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
