"""Every registered layer type: importing this module registers them all.

An explicit list (no star imports), so a reader sees every layer module in one place.
"""

from . import (  # noqa: F401
    convolution,
    crop,
    deconvolution,
    depthwise_convolution,
    dropout,
    fork_activations,
    im2col,
    inner_product,
    input,
    lrn,
    neuron,
    pooling,
    split,
    spp,
)
