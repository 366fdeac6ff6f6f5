"""Caffe's data sources: Datum records, LMDB/LevelDB databases, image lists, and the
DataTransformer that turns a record into a blob, plus torch adapters over them."""

from .datum import array_to_datum, datum_to_array, image_to_datum
from .db import open_db
from .torch_adapters import CaffeTransform, DatumDataset
from .transformer import DataTransformer

__all__ = [
    "CaffeTransform",
    "DataTransformer",
    "DatumDataset",
    "array_to_datum",
    "datum_to_array",
    "image_to_datum",
    "open_db",
]
