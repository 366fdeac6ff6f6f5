"""Every registered layer type: importing this module registers them all.

An explicit list (no star imports), so a reader sees every layer module in one place.
"""

from . import (  # noqa: F401
    accuracy,
    contrastive_loss,
    convolution,
    crop,
    deconvolution,
    depthwise_convolution,
    dropout,
    euclidean_loss,
    fork_activations,
    hinge_loss,
    im2col,
    infogain_loss,
    inner_product,
    input,
    lrn,
    multinomial_logistic_loss,
    neuron,
    pooling,
    sigmoid_cross_entropy_loss,
    smooth_l1_loss,
    softmax,
    softmax_loss,
    split,
    spp,
)
