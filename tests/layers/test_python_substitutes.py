"""Python layers with a native substitute (py-faster-rcnn's ``rpn.proposal_layer``): when the
substitute runs (no opt-in, or the module is not importable) and says so, when the model's own
module runs instead, how ``param_str`` is read, and that real nets build and run with it."""

from __future__ import annotations

import importlib
import sys
import textwrap
import warnings

import pytest
import torch

import torchcaffe
from tests.helpers.harness import make_layer, run
from torchcaffe.errors import BlobWiringError, LayerParamError
from torchcaffe.formats.prototxt import read_net
from torchcaffe.ops._python_substitutes import NativeSubstituteWarning, PyFasterRCNNProposalLayer
from torchcaffe.ops.python_layer import PythonLayer
from torchcaffe.trust import ENV_VAR, allow_python_layers

SHAPES = [(1, 18, 3, 4), (1, 36, 3, 4), (1, 3)]
USER_MODULE = """
import torchcaffe as caffe

class ProposalLayer(caffe.Layer):
    def setup(self, bottom, top):
        top[0].reshape(1, 5)

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        top[0].data[...] = 7.0

    def backward(self, top, propagate_down, bottom):
        pass
"""


def build(param_str="'feat_stride': 16", shapes=SHAPES, **kw):
    snippet = (
        'python_param { module: "rpn.proposal_layer" layer: "ProposalLayer" '
        'param_str: "' + param_str.replace("\n", "\\n") + '" }'
    )
    return make_layer(snippet, shapes, type="Python", name="proposal", **kw)[0]


@pytest.fixture
def no_opt_in(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


@pytest.fixture
def user_rpn(tmp_path, monkeypatch):
    """A module ``rpn.proposal_layer`` of the user's own on sys.path (removed afterwards)."""
    (tmp_path / "rpn").mkdir()
    (tmp_path / "rpn" / "__init__.py").write_text("")
    (tmp_path / "rpn" / "proposal_layer.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield
    for name in ("rpn.proposal_layer", "rpn"):
        sys.modules.pop(name, None)


def test_served_natively_without_opt_in_and_says_so(no_opt_in):
    match = (
        r"layer 'proposal' \(Python\): rpn.proposal_layer.ProposalLayer runs as a native "
        r"equivalent with py-faster-rcnn's default cfg.TEST: .*pre_nms_topn: 6000 "
        r"post_nms_topn: 300.*allow_python_layers=True"
    )
    with pytest.warns(NativeSubstituteWarning, match=match):
        layer = build(phase="TEST")
    assert isinstance(layer, PyFasterRCNNProposalLayer)
    assert layer.layer_param.type == "Python" and "native equivalent" in repr(layer)
    assert "rpn" not in sys.modules  # nothing was imported


def test_opt_in_runs_the_models_module_when_importable(no_opt_in, user_rpn):
    with warnings.catch_warnings():
        warnings.simplefilter("error", NativeSubstituteWarning)
        with allow_python_layers():
            layer = build()
    assert isinstance(layer, PythonLayer) and type(layer.py).__module__ == "rpn.proposal_layer"
    bottoms = [torch.rand(s) for s in SHAPES]
    assert torch.equal(run(layer, bottoms)[0], torch.full((1, 5), 7.0))


def test_without_opt_in_the_module_on_path_is_not_imported(no_opt_in, user_rpn):
    with pytest.warns(NativeSubstituteWarning):
        assert isinstance(build(), PyFasterRCNNProposalLayer)
    assert "rpn.proposal_layer" not in sys.modules


def test_opt_in_without_the_module_falls_back_to_native(no_opt_in):
    with allow_python_layers(), pytest.warns(NativeSubstituteWarning):
        assert isinstance(build(), PyFasterRCNNProposalLayer)


@pytest.mark.parametrize(
    "param_str,stride,scales,ratios",
    [
        ("'feat_stride': 16", 16, [8, 16, 32], [0.5, 1, 2]),
        ("{'feat_stride': 8, 'scales': [4, 8, 16]}", 8, [4, 8, 16], [0.5, 1, 2]),
        ("feat_stride: 16\nscales: !!python/tuple [2, 4, 8]", 16, [2, 4, 8], [0.5, 1, 2]),
        (
            "'feat_stride': 16, 'ratios': [0.5, 2, 1.0], 'scales': (8, 16, 32)",
            16,
            [8, 16, 32],
            [0.5, 2, 1],
        ),
    ],
)
def test_param_str_forms(no_opt_in, param_str, stride, scales, ratios):
    with pytest.warns(NativeSubstituteWarning):
        layer = build(param_str)
    assert layer.param.feat_stride == stride
    assert list(layer.param.scale) == scales and list(layer.param.ratio) == ratios


@pytest.mark.parametrize(
    "param_str,match",
    [
        ("", "param_str needs 'feat_stride'"),
        ("__import__('os').getcwd()", "param_str is not a literal mapping"),
        (
            "'feat_stride': 16, 'base_size': 8",
            r"\['base_size'\] are not read by py-faster-rcnn's"
            r".*modified proposal_layer.py.*allow_python_layers=True",
        ),
        ("'feat_stride': 16.5", "'feat_stride' must be a positive integer"),
        ("'feat_stride': 16, 'scales': [8, 0]", "'scales' must be positive numbers"),
    ],
)
def test_param_str_errors(no_opt_in, param_str, match):
    with pytest.raises(LayerParamError, match=rf"layer 'proposal' \(Python\).*{match}"):
        build(param_str)


def test_error_anchor_count_names_the_layer(no_opt_in):
    with pytest.raises(LayerParamError, match=r"layer 'proposal' \(Python\).*N x 18 x H x W"):
        build(shapes=[(1, 12, 3, 4), (1, 24, 3, 4), (1, 3)])


def test_error_bottom_count(no_opt_in):
    with pytest.raises(BlobWiringError, match=r"layer 'proposal' \(Python\).*exactly 3 bottom"):
        build(shapes=SHAPES[:2])


NET = """
layer { name: "in" type: "Input" top: "feat" top: "rpn_cls_prob" top: "rpn_bbox_pred"
        top: "im_info" input_param { shape { dim: 1 dim: 3 dim: 5 dim: 6 }
        shape { dim: 1 dim: 12 dim: 5 dim: 6 } shape { dim: 1 dim: 24 dim: 5 dim: 6 }
        shape { dim: 1 dim: 3 } } }
layer { name: "proposal" type: "Python" bottom: "rpn_cls_prob" bottom: "rpn_bbox_pred"
        bottom: "im_info" top: "rois"
        python_param { module: "rpn.proposal_layer" layer: "ProposalLayer"
                       param_str: "'feat_stride': 16, 'scales': [1, 2]" } }
layer { name: "pool" type: "ROIPooling" bottom: "feat" bottom: "rois" top: "pooled"
        roi_pooling_param { pooled_h: 2 pooled_w: 3 spatial_scale: 0.0625 } }
"""


def test_net_runs_proposals_into_roi_pooling(no_opt_in):
    with pytest.warns(NativeSubstituteWarning):
        net = torchcaffe.load(read_net(NET), phase="test")
    gen = torch.Generator().manual_seed(0)
    out = net(
        feat=torch.randn(1, 3, 5, 6, generator=gen),
        rpn_cls_prob=torch.rand(1, 12, 5, 6, generator=gen),
        rpn_bbox_pred=torch.randn(1, 24, 5, 6, generator=gen) * 0.3,
        im_info=torch.tensor([[80.0, 96.0, 1.0]]),
    )
    k = out["pooled"].shape[0]
    assert k > 1 and out["pooled"].shape == (k, 3, 2, 3)


def test_faster_rcnn_model_builds_without_opt_in(models_root, no_opt_in):
    path = models_root / "faster_rcnn_resnet18" / "deploy_faster_voc_resnet18-priv-merge.prototxt"
    with pytest.warns(NativeSubstituteWarning, match="layer 'proposal'"):
        net = torchcaffe.load(path)
    assert isinstance(net.layers["proposal"], PyFasterRCNNProposalLayer)
    assert net.blob_shapes["rois"] == (1, 5)
