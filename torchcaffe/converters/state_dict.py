"""caffemodel <-> torch ``state_dict`` files (``torch.save`` format).

Two key styles: the torch face's (``layers.<layer>.weight``: the file loads straight into
``torchcaffe.load(prototxt)``), or with ``readable=True`` the keys a torch model expects
(``conv1.weight``, ``bn1.running_mean``; see ``converters/readable.py`` for BatchNorm).
Going back takes either style (told apart by the ``layers.`` prefix) and writes a caffemodel
Caffe reads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from ..api import load, save_weights
from ..errors import WeightsError
from ..formats.atomic import atomic_write
from ..net.net import TorchNet
from .readable import load_readable_state_dict, readable_state_dict

PathLike = str | os.PathLike


def caffemodel_to_state_dict(
    prototxt: PathLike, caffemodel: PathLike, out: PathLike, *, readable: bool = False
) -> None:
    """Load ``caffemodel`` by layer name into the net of ``prototxt``; save its state_dict."""
    net = load(prototxt, caffemodel)
    state = readable_state_dict(net) if readable else net.state_dict()
    with atomic_write(out, "wb") as f:
        torch.save(state, f)


def state_dict_to_caffemodel(prototxt: PathLike, state_dict: PathLike, out: PathLike) -> None:
    """Load a saved state_dict (either key style) into the net of ``prototxt``; write it as
    a caffemodel."""
    net = load(prototxt)
    try:
        state = torch.load(state_dict, map_location="cpu", weights_only=True)
    except Exception as err:  # torch.load raises many kinds for a bad file
        raise WeightsError(
            f"cannot read a state_dict: {type(err).__name__}: {_load_problem(err)}",
            path=os.fspath(state_dict),
            expected="a torch.save'd dict of tensors",
        ) from None
    if not isinstance(state, Mapping):
        raise WeightsError(
            "not a state_dict", path=os.fspath(state_dict), expected="a dict", got=type(state)
        )
    load_state_into(net, state, os.fspath(state_dict))
    save_weights(net, out)


def _load_problem(err: Exception) -> str:
    """torch.load's reason in one line. For a file ``weights_only`` refuses (random bytes, a
    pickle of other objects) torch writes a paragraph that ends by advising
    ``weights_only=False``, which would run code from the file; only its reason is kept."""
    text = str(err)
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = text.split(marker, 1)[1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else "no reason given"


def is_torchnet_state(state: Mapping[str, torch.Tensor]) -> bool:
    return bool(state) and all(k.startswith("layers.") for k in state)


def load_state_into(net: TorchNet, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Either key style into ``net``; errors name the file and the keys that do not fit."""
    if not is_torchnet_state(state):
        load_readable_state_dict(net, state, source)
        return
    try:
        net.load_state_dict(state)
    except RuntimeError as err:
        raise WeightsError(
            f"state_dict does not fit the net: {err}",
            path=source,
            expected=f"keys of {net.path or net.name}",
        ) from None
