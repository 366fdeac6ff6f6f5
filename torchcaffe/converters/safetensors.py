"""caffemodel <-> safetensors, with the readable keys of ``converters/readable.py``.

safetensors holds plain named tensors (no pickle, memory-mappable), so the file opens in any
torch code with ``safetensors.torch.load_file``; going back needs the prototxt for the net.
"""

from __future__ import annotations

import os

from ..api import load, save_weights
from ..errors import MissingPackageError, WeightsError
from ..formats.atomic import atomic_write
from .readable import readable_state_dict
from .state_dict import load_state_into

PathLike = str | os.PathLike


def _safetensors_torch():
    try:
        import safetensors.torch as st
    except ImportError:
        raise MissingPackageError(
            "safetensors files need the 'safetensors' package",
            hint="pip install torchcaffe[safetensors]",
        ) from None
    return st


def caffemodel_to_safetensors(prototxt: PathLike, caffemodel: PathLike, out: PathLike) -> None:
    """The caffemodel's blobs (by the net of ``prototxt``) as a .safetensors file."""
    st = _safetensors_torch()
    net = load(prototxt, caffemodel)
    state = {k: v.contiguous() for k, v in readable_state_dict(net).items()}
    data = st.save(state, metadata={"format": "pt", "converted_from": "caffemodel"})
    with atomic_write(out, "wb") as f:
        f.write(data)


def safetensors_to_caffemodel(prototxt: PathLike, tensors: PathLike, out: PathLike) -> None:
    """A .safetensors file (readable or ``layers.`` keys) as a caffemodel for ``prototxt``."""
    st = _safetensors_torch()
    net = load(prototxt)
    path = os.fspath(tensors)
    try:
        state = st.load_file(path)
    except Exception as err:  # safetensors raises its own SafetensorError and OSErrors
        raise WeightsError(f"cannot read a safetensors file: {err}", path=path) from None
    load_state_into(net, state, path)
    save_weights(net, out)
