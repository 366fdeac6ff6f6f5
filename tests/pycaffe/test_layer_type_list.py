"""caffe.layer_type_list as pycaffe's test_layer_type_list.py checks it."""

from __future__ import annotations

import torchcaffe as caffe


def test_layer_type_list_is_unique_sorted_and_buildable():
    types = caffe.layer_type_list()
    assert len(types) == len(set(types)) and "Convolution" in types and "Python" in types
    assert list(types) == sorted(types)
    for name in types:  # NetSpec makes a layer function for each
        assert callable(getattr(caffe.layers, name))
