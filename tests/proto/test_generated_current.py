"""The committed caffe_pb2 must be what protoc generates from proto/caffe.proto today."""

from __future__ import annotations

from torchcaffe.proto import caffe_pb2, generate


def test_regenerated_module_matches_committed(tmp_path):
    generate.generate(tmp_path)
    for name in ("caffe_pb2.py", "caffe_pb2.pyi"):
        fresh = (tmp_path / name).read_text()
        committed = (generate.DEFAULT_OUT / name).read_text()
        assert fresh == committed, (
            f"torchcaffe/proto/{name} is stale: run `python -m torchcaffe.proto.generate`"
        )


def test_descriptor_is_caffes_package():
    # Text-format files and pycaffe code refer to messages as caffe.<Name>.
    assert caffe_pb2.DESCRIPTOR.package == "caffe"
    assert caffe_pb2.LayerParameter.DESCRIPTOR.full_name == "caffe.LayerParameter"
