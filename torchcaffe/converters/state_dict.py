"""caffemodel <-> torch ``state_dict`` files of the compiled net (``torch.save`` format).

The state_dict keys are the torch face's (``layers.<layer>.weight``), so the file loads
straight into ``torchcaffe.load(prototxt)``; going back writes a caffemodel Caffe reads.
"""

from __future__ import annotations

import os

import torch

from ..api import load, save_weights
from ..errors import WeightsError
from ..formats.atomic import atomic_write

PathLike = str | os.PathLike


def caffemodel_to_state_dict(prototxt: PathLike, caffemodel: PathLike, out: PathLike) -> None:
    """Load ``caffemodel`` by layer name into the net of ``prototxt``; save its state_dict."""
    net = load(prototxt, caffemodel)
    with atomic_write(out, "wb") as f:
        torch.save(net.state_dict(), f)


def state_dict_to_caffemodel(prototxt: PathLike, state_dict: PathLike, out: PathLike) -> None:
    """Load a saved state_dict into the net of ``prototxt``; write it as a caffemodel."""
    net = load(prototxt)
    state = torch.load(state_dict, map_location="cpu", weights_only=True)
    try:
        net.load_state_dict(state)
    except RuntimeError as err:
        raise WeightsError(
            f"state_dict does not fit the net: {err}",
            path=os.fspath(state_dict),
            expected=f"keys of {os.fspath(prototxt)}",
        ) from None
    save_weights(net, out)
