"""A torch exporter that fails as torch 2.11 and 2.12 did: its trace registered a global
buffer-registration hook, then failed, and the hook stayed (see ``net.export``'s
``registration_hooks_kept``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch


def _failing_export(*args, **kwargs):
    torch.nn.modules.module.register_module_buffer_registration_hook(lambda m, n, b: b)
    raise RuntimeError("could not guard on a data-dependent expression")


@contextlib.contextmanager
def leaking_failed_export(monkeypatch: pytest.MonkeyPatch, module: object) -> Iterator[None]:
    """Within: ``module.export`` (``torch.export`` or ``torch.onnx``) registers a hook and
    fails. On the way out, no hook registered within may be left."""
    hooks = torch.nn.modules.module._global_buffer_registration_hooks
    before = dict(hooks)
    monkeypatch.setattr(module, "export", _failing_export)
    yield
    assert dict(hooks) == before


# An SSD's heads (two activations) before its DetectionOutput, whose tops' sizes depend on
# the values: what a trace or an ONNX export must stop before.
HEADS_BEFORE_DETECTION = """
name: "heads_before_detection"
layer { name: "data" type: "Input" top: "loc" top: "conf" top: "prior"
  input_param { shape { dim: 2 dim: 108 } shape { dim: 2 dim: 108 }
    shape { dim: 1 dim: 2 dim: 108 } } }
layer { name: "loc_act" type: "TanH" bottom: "loc" top: "loc_act" }
layer { name: "conf_act" type: "Sigmoid" bottom: "conf" top: "conf_act" }
layer { name: "det" type: "DetectionOutput" bottom: "loc_act" bottom: "conf_act" bottom: "prior"
  top: "detection_out"
  detection_output_param { num_classes: 4 share_location: true background_label_id: 0
    nms_param { nms_threshold: 0.45 top_k: 20 } code_type: CENTER_SIZE keep_top_k: 8
    confidence_threshold: 0.1 } }
"""
