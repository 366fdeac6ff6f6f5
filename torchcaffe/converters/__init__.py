"""Bridges between Caffe weights and other formats (installed as ``torchcaffe.converters``).

The repository's top-level ``converters/`` holds thin command-line scripts over these.
"""

from .readable import load_readable_state_dict, readable_state_dict
from .safetensors import caffemodel_to_safetensors, safetensors_to_caffemodel
from .state_dict import caffemodel_to_state_dict, state_dict_to_caffemodel

__all__ = [
    "caffemodel_to_state_dict",
    "state_dict_to_caffemodel",
    "caffemodel_to_safetensors",
    "safetensors_to_caffemodel",
    "readable_state_dict",
    "load_readable_state_dict",
]
