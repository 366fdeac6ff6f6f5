"""Net surgery through the Caffe face's numpy views, then another forward (found, not fixed).

``FoldedAffine`` caches the folded weights on the source tensors' autograd versions; a write
through ``net.params[name][i].data`` (a numpy view of the same memory) does not bump them, so
the next forward still runs the old fold. Caffe would use the new params. Visible as an xfail
until the Caffe face marks written params (e.g. bumping the version in ``before_write``
without breaking a recorded backward).
"""

from __future__ import annotations

import numpy as np
import pytest

import torchcaffe as caffe

NET = """
input: "data" input_shape { dim: 2 dim: 3 dim: 4 dim: 4 }
layer { name: "c" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c"
  batch_norm_param { use_global_stats: true } }
layer { name: "s" type: "Scale" bottom: "c" top: "c" scale_param { bias_term: true } }
"""


@pytest.mark.xfail(
    strict=True,
    reason="folded weights are cached on tensor versions, which numpy writes leave unchanged",
)
def test_a_param_written_between_forwards_reaches_the_next_forward(tmp_path):
    proto = tmp_path / "net.prototxt"
    proto.write_text(NET)
    net = caffe.Net(str(proto), caffe.TEST)
    net.params["bn"][1].data[...] = 1  # variance
    net.params["bn"][2].data[...] = 1  # scale factor
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
    net.blobs["data"].data[...] = x
    net.forward()
    net.params["c"][0].data[...] *= 2  # surgery between two forwards
    net.params["bn"][0].data[...] = 5.0  # mean
    got = net.forward()["c"]
    w, b = net.params["c"][0].data.reshape(3, 3), net.params["c"][1].data
    want = (np.einsum("oc,nchw->nohw", w, x) + b[None, :, None, None] - 5.0) / np.sqrt(1 + 1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
