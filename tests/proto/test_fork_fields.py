"""The fork-field tables agree with the schema they describe."""

from __future__ import annotations

import pytest

from torchcaffe.proto import caffe_pb2, fork_fields

POOL = caffe_pb2.DESCRIPTOR.pool


def _field(full_message: str, name: str):
    message = POOL.FindMessageTypeByName(full_message)
    assert name in message.fields_by_name, f"{full_message} has no field {name!r}"
    return message.fields_by_name[name]


@pytest.mark.parametrize("record", fork_fields.FORK_FIELDS, ids=lambda r: f"{r.message}.{r.field}")
def test_fork_field_sits_at_its_forks_number(record):
    assert _field(record.message, record.field).number == record.number
    assert record.fork in fork_fields.FORKS


@pytest.mark.parametrize(
    "record", fork_fields.RELOCATED_FIELDS, ids=lambda r: f"{r.fork}:{r.message}.{r.field}"
)
def test_relocated_field_and_the_field_it_clashes_with(record):
    assert _field(record.message, record.field).number == record.number
    assert record.number != record.fork_number
    assert record.fork in fork_fields.FORKS
    message, _, name = record.clashes_with.rpartition(".")
    clash = _field(message, name)
    if clash.full_name != f"{record.message}.{record.field}":
        assert clash.number == record.fork_number, (
            f"{record.clashes_with} is at {clash.number}, not the fork's {record.fork_number}"
        )


def test_every_relocated_number_is_recorded():
    """Numbers of 10000 and up exist only to move a clashing fork field: each must be listed."""
    listed = {(r.message, r.field) for r in fork_fields.RELOCATED_FIELDS}
    moved = [(m.full_name, f.name) for m in _all_messages() for f in m.fields if f.number >= 10000]
    assert moved and not [m for m in moved if m not in listed]


@pytest.mark.parametrize("record", fork_fields.FORK_MESSAGES, ids=lambda r: r.message)
def test_fork_message_exists(record):
    assert POOL.FindMessageTypeByName(record.message)
    assert record.fork in fork_fields.FORKS


def _all_messages():
    stack = list(caffe_pb2.DESCRIPTOR.message_types_by_name.values())
    while stack:
        message = stack.pop()
        yield message
        stack.extend(message.nested_types)
