"""Proto I/O: text/binary nets and solvers, Caffe's upgrade path, BlobProto files, atomic writes."""

from .atomic import atomic_write
from .binaryproto import (
    array_to_blob_proto,
    blob_proto_to_array,
    read_blob_proto,
    read_blob_proto_vector,
    read_mean_file,
    write_blob_proto,
    write_blob_proto_vector,
)
from .prototxt import (
    parse_net_text,
    read_net,
    read_net_binary,
    read_net_text,
    read_solver,
    write_binary,
    write_text,
)
from .upgrade import UpgradeWarning, net_needs_upgrade, upgrade_net_as_needed

__all__ = [
    "UpgradeWarning",
    "array_to_blob_proto",
    "atomic_write",
    "blob_proto_to_array",
    "net_needs_upgrade",
    "parse_net_text",
    "read_blob_proto",
    "read_blob_proto_vector",
    "read_mean_file",
    "read_net",
    "read_net_binary",
    "read_net_text",
    "read_solver",
    "upgrade_net_as_needed",
    "write_binary",
    "write_blob_proto",
    "write_blob_proto_vector",
    "write_text",
]
