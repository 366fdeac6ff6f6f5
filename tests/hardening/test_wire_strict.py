"""The streaming caffemodel reader accepts exactly what protobuf's parser accepts (issue 13,
finding 9): a packed float field whose length is not a multiple of 4, corrupt tags and wire
types, stray end-groups and corrupt nested parameters are errors; unknown groups are skipped."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from torchcaffe.errors import WeightsError
from torchcaffe.formats import caffemodel
from torchcaffe.formats.wire import encode_varint, len_field_header, tag
from torchcaffe.proto import caffe_pb2


def layer(body: bytes) -> bytes:
    return len_field_header(100, len(body)) + body


def named(body: bytes = b"") -> bytes:
    return len_field_header(1, 2) + b"ip" + body


def blob(body: bytes) -> bytes:
    return len_field_header(7, len(body)) + body


def read(tmp_path, data: bytes) -> list:
    path = tmp_path / "m.caffemodel"
    path.write_bytes(data)
    return list(caffemodel.read_binary_weights(path))


def protobuf_accepts(data: bytes) -> bool:
    try:
        caffe_pb2.NetParameter.FromString(data)
    except DecodeError:
        return False
    return True


REJECTED = {
    "packed_float_5_bytes": layer(named(blob(len_field_header(5, 5) + b"\0" * 5))),
    "packed_double_12_bytes": layer(named(blob(len_field_header(8, 12) + b"\0" * 12))),
    "wire_type_6": layer(named(tag(9, 6))),
    "wire_type_7_top_level": tag(3, 7),
    "field_number_0": layer(b"\x00\x01"),
    "field_number_2_pow_29": layer(named(encode_varint((2**29) << 3) + b"\x00")),
    "tag_over_32_bits": layer(named(encode_varint(2**32 + (9 << 3)) + b"\x00")),
    "stray_end_group": layer(named(tag(9, 4))),
    "unclosed_group": layer(named(tag(9, 3) + tag(1, 0) + b"\x01")),
    "mismatched_end_group": layer(named(tag(9, 3) + tag(10, 4))),
    "varint_11_bytes": layer(named(tag(10, 0) + b"\xff" * 10 + b"\x01")),
    "packed_dims_varint_runs_out": layer(
        named(blob(len_field_header(7, 4) + len_field_header(1, 2) + b"\xff\xff"))
    ),
    "corrupt_nested_param": layer(
        named(len_field_header(106, 3) + len_field_header(1, 5) + b"\x00")
    ),
    "corrupt_net_state": len_field_header(6, 2) + b"\x08\xff",
    "length_past_end": layer(named(len_field_header(8, 50))),
}


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_reader_rejects_what_protobuf_rejects(tmp_path, case):
    data = REJECTED[case]
    assert not protobuf_accepts(data), "the case must be one protobuf rejects"
    with pytest.raises(WeightsError, match="m.caffemodel"):
        read(tmp_path, data)


ACCEPTED = {
    "unknown_group_is_skipped": layer(named(tag(900, 3) + tag(1, 0) + b"\x05" + tag(900, 4))),
    "unpacked_floats": layer(
        named(blob(tag(5, 5) + np.float32(1.5).tobytes() + tag(5, 5) + np.float32(2).tobytes()))
    ),
    "ten_byte_varint": layer(named(tag(10, 0) + b"\xff" * 9 + b"\x01")),
    "shape_given_twice_merges": layer(
        named(
            blob(
                len_field_header(7, 3)
                + len_field_header(1, 1)
                + b"\x02"
                + len_field_header(7, 3)
                + len_field_header(1, 1)
                + b"\x03"
                + len_field_header(5, 24)
                + np.arange(6, dtype="<f4").tobytes()
            )
        )
    ),
    "negative_legacy_num": layer(named(blob(tag(1, 0) + encode_varint(-1)))),
}


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_reader_agrees_with_protobuf_on_accepted_bytes(tmp_path, case):
    data = ACCEPTED[case]
    msg = caffe_pb2.NetParameter.FromString(data)
    records = read(tmp_path, data)
    assert [r.name for r in records] == [lp.name for lp in msg.layer]
    for record, lp in zip(records, msg.layer):
        assert len(record.blobs) == len(lp.blobs)
        for got, want in zip(record.blobs, lp.blobs):
            if any(want.HasField(f) for f in ("num", "channels", "height", "width")):
                assert got.shape == (want.num, want.channels, want.height, want.width)
            else:
                assert got.shape == tuple(want.shape.dim)
            assert np.array_equal(got.data, np.asarray(want.data, np.float32))
