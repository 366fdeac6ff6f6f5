"""Bridges between Caffe weights and other formats (installed as ``torchcaffe.converters``).

The repository's top-level ``converters/`` holds thin command-line scripts over these.
"""

from .state_dict import caffemodel_to_state_dict, state_dict_to_caffemodel

__all__ = ["caffemodel_to_state_dict", "state_dict_to_caffemodel"]
