"""Every schema constant a layer compares with is a plain class attribute from import on.

protobuf's upb message classes look up a nested enum, its values and nested messages on first
access. Torch 2.11's dynamo read such a constant not yet looked up wrongly and silently: in a
fresh process, a compiled Eltwise SUM with coefficients ran as MAX
(``EltwiseParameter.SUM`` never equalled the layer's operation). ``torchcaffe.proto`` looks
them all up at import."""

from __future__ import annotations

import subprocess
import sys
import textwrap

FRESH = textwrap.dedent(
    """
    import torch
    import torchcaffe
    from google.protobuf import text_format
    from torchcaffe.proto import caffe_pb2

    missing = []

    def visit(cls, descriptor):
        names = [e.name for e in descriptor.enum_types]
        names += [v.name for e in descriptor.enum_types for v in e.values]
        names += [m.name for m in descriptor.nested_types]
        missing.extend(f"{cls.__name__}.{n}" for n in names if n not in cls.__dict__)
        for nested in descriptor.nested_types:
            visit(getattr(cls, nested.name), nested)

    for name, descriptor in caffe_pb2.DESCRIPTOR.message_types_by_name.items():
        visit(getattr(caffe_pb2, name), descriptor)
    assert not missing, missing[:10]

    # the case torch 2.11 compiled wrong: compiled before anything ran it eagerly
    net = torchcaffe.load(text_format.Parse('''
        input: "a" input_shape { dim: 2 dim: 3 } input: "b" input_shape { dim: 2 dim: 3 }
        layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "b" top: "y"
          eltwise_param { operation: SUM coeff: 0.5 coeff: -2 } }''',
        caffe_pb2.NetParameter()), phase="test")
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    got = torch.compile(net, backend="eager")(a=a, b=b)["y"]
    torch.testing.assert_close(got, 0.5 * a - 2 * b)
    print("ok")
    """
)


def test_schema_constants_are_looked_up_at_import_and_compile_right():
    run = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
