"""The supported-layers table, generated from the registry (never written by hand).

One row per registered type: the fork that defines it (if not BVLC), its params message and
fields, whether Caffe computes a gradient through it, and any restriction the class declares.
``torchcaffe layers --out docs/supported_layers.md`` writes it; a test keeps the committed file
current.
"""

from __future__ import annotations

import inspect

from ..proto import caffe_pb2
from ..registry import registered_layers

HEADER = """# Supported layer types

Generated from the layer registry by `torchcaffe layers --out docs/supported_layers.md`;
do not edit by hand. Every listed type runs forward and (where Caffe has one) backward, and
accepts every field of its params message unless the restrictions column says otherwise.

The fork column names the Caffe fork that defines a type; "-" is BVLC Caffe.

| Type | Fork | Params message | Backward | Summary | Restrictions |
|---|---|---|---|---|---|
"""


def _params_message(field: str | None) -> str:
    if field is None:
        return "-"
    fd = caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name[field]
    fields = ", ".join(f.name for f in fd.message_type.fields)
    return f"`{field}` ({fd.message_type.name}: {fields})"


def _summary(cls: type) -> str:
    paragraph = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
    sentence = paragraph.split(". ")[0].rstrip(".")
    return sentence.replace("|", "\\|")


def supported_layers_markdown() -> str:
    rows = []
    for name, cls in sorted(registered_layers().items()):
        backward = "yes" if cls.has_backward else "no (as Caffe)"
        rows.append(
            f"| {name} | {cls.fork or '-'} | {_params_message(cls.param_field)} | {backward} | "
            f"{_summary(cls)} | {cls.restrictions.replace('|', '/') or '-'} |"
        )
    return HEADER + "\n".join(rows) + "\n"
