"""The one tree of errors torchcaffe raises.

Every message says where the problem is (file, layer), what was expected and what was found,
and, where one exists, what to do next — in the manner of Caffe's "rename the layer" hint.
Format: ``"{path}: layer '{name}' ({type}): {what}; expected {x}, got {y}. {hint}"``.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from google.protobuf import message as protobuf_message


class TorchCaffeError(Exception):
    """Root of every error torchcaffe raises on bad input."""

    def __init__(
        self,
        what: str,
        *,
        path: str | None = None,
        layer: str | None = None,
        layer_type: str | None = None,
        expected: Any = None,
        got: Any = None,
        hint: str | None = None,
    ) -> None:
        self.what = what
        self.path = None if path is None else str(path)
        self.layer = layer
        self.layer_type = layer_type
        self.expected = expected
        self.got = got
        self.hint = hint
        super().__init__(self._format())

    def _format(self) -> str:
        parts = []
        if self.path:
            parts.append(f"{self.path}: ")
        if self.layer is not None:
            kind = f" ({self.layer_type})" if self.layer_type else ""
            parts.append(f"layer '{self.layer}'{kind}: ")
        parts.append(self.what)
        # a side that is None was not given ("got None" read as if None had been found)
        found = [] if self.got is None else [f"got {self.got}"]
        if self.expected is not None:
            found.insert(0, f"expected {self.expected}")
        if found:
            parts.append("; " + ", ".join(found))
        if self.hint:
            end = "" if parts[-1].endswith(".") else "."  # a 'what' that is a sentence
            parts.append(f"{end} {self.hint}")
        return "".join(parts)

    def located(
        self, *, path: str | None = None, layer: str | None = None, layer_type: str | None = None
    ) -> TorchCaffeError:
        """Fill in the location where the raiser did not know it; returns self for ``raise``."""
        if path is not None and self.path is None:
            self.path = str(path)
        if layer is not None and self.layer is None:
            self.layer = layer
        if layer_type is not None and self.layer_type is None:
            self.layer_type = layer_type
        self.args = (self._format(),)
        return self

    def __str__(self) -> str:
        return self._format()


class PrototxtError(TorchCaffeError):
    """A text or binary proto file that does not parse; carries line and column when known."""

    def __init__(
        self,
        what: str,
        *,
        path: str | None = None,
        line: int | None = None,
        column: int | None = None,
        **kw: Any,
    ) -> None:
        self.line = line
        self.column = column
        super().__init__(what, path=path, **kw)

    def _format(self) -> str:
        if self.path and self.line is not None:
            loc = f"{self.path}:{self.line}" + (f":{self.column}" if self.column else "")
            saved, self.path = self.path, None
            try:
                return f"{loc}: {super()._format()}"
            finally:
                self.path = saved
        return super()._format()


class MissingProtoError(PrototxtError, RuntimeError):
    """A proto file that is not there. Also a RuntimeError: pycaffe raises one ("Could not
    open file") for a net or weights file it cannot open, and scripts catch that."""


class UnknownLayerTypeError(TorchCaffeError):
    """A layer type string no registered layer answers to; lists close matches."""

    def __init__(
        self, type_name: str, close_matches: list[str] | tuple[str, ...] = (), **kw: Any
    ) -> None:
        self.type_name = type_name
        self.close_matches = list(close_matches)
        hint = (
            f"did you mean {', '.join(repr(m) for m in self.close_matches)}?"
            if self.close_matches
            else "see torchcaffe.layer_type_list() for the supported types; a Caffe fork's "
            "own type can be written in Python and registered (docs/forks.md)"
        )
        kw.setdefault("hint", hint)
        kw.setdefault("layer_type", type_name)
        super().__init__(f"unknown layer type {type_name!r}", **kw)


class LayerParamError(TorchCaffeError):
    """A layer's parameters (or bottom shapes) that Caffe would reject at SetUp."""


class DrawError(LayerParamError, ValueError):
    """``caffe.draw``: a layer it cannot place or label (a ValueError, as pycaffe's draw raises)."""


class BlobShapeError(LayerParamError):
    """An impossible blob shape or axis index."""


class BlobWiringError(TorchCaffeError):
    """Net wiring Caffe rejects: unknown bottom, duplicate top, wrong bottom/top count."""


class UnknownNameError(TorchCaffeError, KeyError):
    """A layer or blob name the net does not have (also a KeyError, as a dict lookup is)."""


class UnknownLayerError(UnknownNameError, ValueError):
    """A layer name the net lacks. Also a ValueError: pycaffe finds ``forward``/``backward``'s
    start and end layers with ``list.index``, which raises one."""


class LayerIndexError(TorchCaffeError, IndexError):
    """A layer index outside the net (Caffe's Net::ForwardFromTo/BackwardFromTo CHECK it)."""


class UsageError(TorchCaffeError, TypeError):
    """A Python call with the wrong arguments (e.g. ``caffe.Net`` without a phase)."""


class ArrayShapeError(TorchCaffeError, ValueError):
    """An array passed to a pycaffe ``caffe.io`` function with the wrong shape (a ValueError,
    as pycaffe raises)."""


class UndefinedMapException(TorchCaffeError):
    """``caffe.coord_map``: the layer has no coordinate mapping (it is not spatial)."""


class AxisMismatchException(TorchCaffeError):
    """``caffe.coord_map``: two composed maps start at different axes."""


class CoordMapError(TorchCaffeError, RuntimeError):
    """``caffe.coord_map.crop``: no chain of spatial layers joins the two tops (a RuntimeError,
    as pycaffe raises)."""


class ConfigError(TorchCaffeError, ValueError):
    """A setting with a bad value: a ``TORCHCAFFE_*`` environment variable or a
    ``torchcaffe.limits`` value. A ValueError too, as these were before they had a class."""


class WireError(TorchCaffeError):
    """Bytes that are not a well-formed protobuf message (the streaming weights reader)."""


class RegistryError(TorchCaffeError):
    """Two classes claim one Caffe type string (a programming error in torchcaffe)."""


class WeightsError(TorchCaffeError):
    """A caffemodel / HDF5 weights file that does not fit the net."""


class MissingWeightsError(WeightsError, RuntimeError):
    """A weights file that is not there; also a RuntimeError (see ``MissingProtoError``)."""


class UnsupportedError(TorchCaffeError, NotImplementedError):
    """Input that is valid Caffe but that torchcaffe does not implement (yet)."""


class MissingPackageError(UnsupportedError, ImportError):
    """An optional package (an extra) is not installed; the message names the extra. Also
    an ImportError, as pycaffe's own imports fail (scikit-image, pydot, selective_search)."""


class SolverError(TorchCaffeError):
    """A solver definition or solver state that Caffe would reject."""


class DataError(TorchCaffeError):
    """A data source (DB, image list, HDF5 file, mean file) that cannot be read as asked."""


class FileReadError(DataError, OSError):
    """A file that cannot be read (missing, no permission). Also an OSError with the errno,
    strerror and filename open() gave: code catching OSError (or IOError, as pycaffe-era
    scripts do around ``caffe.io.load_image``) keeps working."""

    @classmethod
    def of(cls, err: OSError, path: str) -> FileReadError:
        made = cls(f"cannot read the file: {err.strerror or err}", path=path)
        made.errno, made.strerror, made.filename = err.errno, err.strerror, path
        return made


class ProtoDecodeError(DataError, protobuf_message.DecodeError):
    """Bytes that do not parse as the proto message asked for. Also protobuf's DecodeError,
    which pycaffe's ``caffe.io`` lets through."""


class InputArrayError(DataError, RuntimeError):
    """Arrays ``net.set_input_arrays`` cannot serve. Also a RuntimeError, as pycaffe's
    binding throws for each of its checks."""


class FileWriteError(TorchCaffeError, OSError):
    """A file that cannot be written (its folder missing, a full disk, no permission), named
    as the caller asked for it. Also an OSError with the ``errno``, ``strerror`` and
    ``filename`` that open() or write() gave, so code catching OSError keeps working."""

    @classmethod
    def of(cls, err: OSError, path: str) -> FileWriteError:
        folder = os.path.dirname(os.path.abspath(path))
        hint = None
        if err.errno == errno.ENOENT and not os.path.isdir(folder):
            hint = f"its folder {folder!r} does not exist"
        elif err.errno == errno.ENOTDIR:
            hint = "a part of its folder path is a file"
        made = cls(err.strerror or str(err), path=path, hint=hint)
        made.errno, made.strerror, made.filename = err.errno, err.strerror, path
        return made


class DeviceError(TorchCaffeError):
    """A device request the machine cannot serve (e.g. GPU calls without CUDA)."""


class TrustError(TorchCaffeError):
    """Code from a model directory (Python layers) that the user has not opted in to run."""


class PartialWeightsWarning(UserWarning):
    """A weights file that left some of the net's param layers at their fillers.

    Caffe copies such a file silently (fine-tuning relies on it); torchcaffe names the layers.
    ``strict=True`` on the loaders makes this a ``WeightsError`` instead.
    """


class TracedStateWarning(UserWarning):
    """A recurrent layer that carries its hidden state from one forward to the next, traced
    or exported: the graph cannot carry it, so each call starts from the state held when it
    was made."""


class ExportError(TorchCaffeError):
    """A model that cannot be written in the target format (an op Caffe has no layer for)."""


class SchemaError(TorchCaffeError):
    """A fork's caffe.proto that cannot be used: it does not compile, or clashes with ours."""
