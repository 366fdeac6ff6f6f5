"""Python: a layer whose code ships with the model (pycaffe's PythonLayer).

Refused unless the user opts in (``allow_python_layers=True`` or
TORCHCAFFE_ALLOW_PYTHON_LAYERS=1): importing the module runs arbitrary code. The user's class
works on Blobs with numpy data, so tensors cross to the host and back around each call; the
gradient comes from the class's own ``backward``, wrapped in an autograd Function.

Well-known Python layers (``_python_substitutes.NATIVE_SUBSTITUTES``: py-faster-rcnn's
``rpn.proposal_layer.ProposalLayer``) run as a native equivalent instead, with a
``NativeSubstituteWarning`` saying so, unless the user opted in and the module can be
imported: then the model's own module runs, since it may read settings (py-faster-rcnn's
``cfg``) that only the user's script sets. The substitute imports nothing, so it needs no
opt-in.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch

from ..blob import Blob
from ..errors import LayerParamError, TorchCaffeError, TrustError
from ..net.state import Phase
from ..proto import caffe_pb2
from ..registry import register_layer
from ..trust import ENV_VAR, python_layers_allowed
from ._python_substitutes import NATIVE_SUBSTITUTES, RUN_MODULE_HINT, NativeSubstituteWarning
from .base import ANY, Arity, CaffeLayer, Shape

OPT_IN_HINT = (
    "Python layers import and run code named by the model; if you trust this "
    "model, pass allow_python_layers=True (torchcaffe.load / caffe.Net), "
    f"-allow_python_layers (the torchcaffe command line) or set {ENV_VAR}=1"
)


# Set on exceptions raised by the user's layer code, which keep their own type.
USER_CODE_ATTR = "_torchcaffe_python_layer"


def note_user_error(err: BaseException, note: str) -> BaseException:
    """Mark ``err`` as raised by a Python layer's code and add ``note`` to it (PEP 678 notes;
    on Python 3.10, where nothing prints them, the note also goes into ``args[0]``)."""
    setattr(err, USER_CODE_ATTR, True)
    if hasattr(err, "add_note"):
        err.add_note(note)
    else:  # pragma: no cover - Python 3.10
        notes = list(getattr(err, "__notes__", []))
        err.__notes__ = notes + [note]  # type: ignore[attr-defined]
        if err.args and isinstance(err.args[0], str):
            err.args = (f"{err.args[0]} [{note}]",) + err.args[1:]
    return err


def from_user_code(err: BaseException) -> bool:
    """Did a Python layer's own code raise ``err`` (see note_user_error)?"""
    return bool(getattr(err, USER_CODE_ATTR, False))


def import_layer_class(lp: caffe_pb2.LayerParameter) -> type:
    """The user's layer class named by ``python_param`` (module on sys.path, class name)."""
    module_name, class_name = lp.python_param.module, lp.python_param.layer
    if not module_name or not class_name:
        raise LayerParamError(
            "python_param needs both module and layer",
            expected="python_param { module: ... layer: ... }",
            got=f"module={module_name!r} layer={class_name!r}",
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise _import_error(module_name, err) from err
    except Exception as err:  # SyntaxError/TabError, or the module's own code failing
        where = _module_file(module_name, err)
        raise LayerParamError(
            f"Python layer module {module_name!r} ({where}) failed to import: "
            f"{type(err).__name__}: {err}",
            hint="fix the module's source",
        ) from err
    try:
        return getattr(module, class_name)
    except AttributeError:
        raise LayerParamError(f"module {module_name!r} has no layer class {class_name!r}") from None


def _import_error(module_name: str, err: ImportError) -> LayerParamError:
    """The module not found, or found but missing a module it imports: pycaffe layers
    ``import caffe``, which needs the caffe alias here."""
    missing = err.name if isinstance(err, ModuleNotFoundError) else None
    parts = module_name.split(".")
    if missing is None or missing in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}:
        return LayerParamError(
            f"cannot import Python layer module {module_name!r}: {err}",
            hint="put the module's directory on PYTHONPATH (sys.path)",
        )
    where = _module_file(module_name, err)
    if missing.partition(".")[0] == "caffe":
        hint = (
            "the module imports caffe: call torchcaffe.install_caffe_alias() first (or pip "
            "install the shim) so that import caffe gives torchcaffe"
        )
    else:
        hint = f"install {missing!r}, which the module imports"
    return LayerParamError(
        f"Python layer module {module_name!r} ({where}) failed to import: {err}", hint=hint
    )


def _module_file(module_name: str, err: BaseException) -> str:
    """The file of a module that failed to import: the SyntaxError's file, else its spec's."""
    filename = getattr(err, "filename", None)
    if isinstance(err, SyntaxError) and filename:
        return str(filename)
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        spec = None
    return str(spec.origin) if spec is not None and spec.origin else "file unknown"


def native_substitute(
    lp: caffe_pb2.LayerParameter,
) -> Callable[[caffe_pb2.LayerParameter, Sequence[Shape]], CaffeLayer] | None:
    """The native builder serving this Python layer, or None to run the model's own module.

    None for modules without a substitute, and for those with one when the user opted in and
    the module's top-level package is on sys.path (looked up without importing it).
    """
    pp = lp.python_param
    builder = NATIVE_SUBSTITUTES.get((pp.module, pp.layer))
    if builder is None or not python_layers_allowed():
        return builder
    try:
        found = importlib.util.find_spec(pp.module.partition(".")[0]) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else builder


def _host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the host for the layer's numpy code: a bfloat16 one (a .bfloat16() net)
    as float32, since numpy has no bfloat16 (``.numpy()`` would raise torch's bare error);
    the tops are cast back to the net's dtype."""
    host = tensor.detach().to("cpu")
    return host.float() if host.dtype == torch.bfloat16 else host


def _fill(blob: Blob, tensor: torch.Tensor) -> None:
    """Copy ``tensor`` into ``blob``, reshaped to it. The Blob object stays: Caffe hands a
    layer the same bottom blobs in every call, and a layer may keep one from ``setup``."""
    host = _host(tensor)
    if blob.dtype != host.dtype:  # the next reshape allocates memory of the tensor's dtype
        blob.dtype = host.dtype
        blob.capacity = 0
    blob.reshape(tuple(host.shape))
    if blob.count():
        blob.mutable_cpu_data().copy_(host)


class _PythonFunction(torch.autograd.Function):
    """Forward/backward through the user's numpy code; params get the diffs it writes."""

    @staticmethod
    def forward(
        ctx: Any, layer: PythonLayer, n_bottoms: int, *inputs: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        ctx.layer = layer
        ctx.n_bottoms = n_bottoms
        ctx.device = inputs[0].device if inputs else torch.device("cpu")
        tops = layer.run_forward(inputs[:n_bottoms])
        ctx.run = layer.forward_runs
        # detached: no version check (an in-place layer after this one may write them)
        ctx.datas = [t.detach() for t in inputs[:n_bottoms]], [t.detach() for t in tops]
        return tops

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        layer: PythonLayer = ctx.layer
        if layer.forward_runs != ctx.run:  # the Blobs hold a later call's data
            layer.restore_blobs(*ctx.datas)
        wanted = [ctx.needs_input_grad[2 + i] for i in range(ctx.n_bottoms)]
        bottom_diffs, param_diffs = layer.run_backward(grads, wanted)
        out: list[torch.Tensor | None] = [None, None]
        out += [d.to(ctx.device) if w else None for d, w in zip(bottom_diffs, wanted)]
        out += [None if d is None else d.to(ctx.device) for d in param_diffs]
        return tuple(out)


@register_layer("Python")
class PythonLayer(CaffeLayer):
    """Runs ``python_param { module layer param_str }``'s class (a ``caffe.Layer``).

    Caffe type: Python (PythonParameter). As Caffe's SetUp, construction calls the class's
    ``setup`` then ``reshape`` once; each forward calls ``reshape`` then ``forward``. The
    layer keeps one set of bottom and top Blobs for every call, so top shapes ``setup`` gives
    stay until a ``reshape`` changes them, and Blobs kept from ``setup`` see each call's data.
    A module with a native substitute (py-faster-rcnn's ``rpn.proposal_layer``) builds that
    instead, with a NativeSubstituteWarning, unless opted in with the module importable.
    Differs from torch: computes on the host with numpy, whatever the device.
    """

    bottoms: ClassVar[Arity] = ANY
    tops: ClassVar[Arity] = ANY
    param_field = "python_param"
    host_forward = "it runs the user's Python over numpy arrays"
    restrictions = (
        "runs the model's module only with the allow_python_layers opt-in; "
        "py-faster-rcnn's rpn.proposal_layer runs as a native equivalent unless "
        "opted in with the module on sys.path"
    )

    @classmethod
    def from_param(
        cls, layer_param: caffe_pb2.LayerParameter, bottom_shapes: Sequence[Shape]
    ) -> CaffeLayer:
        """A known Python layer becomes its native substitute (layer_param kept as read)."""
        builder = native_substitute(layer_param)
        if builder is None:
            return super().from_param(layer_param, bottom_shapes)
        layer = builder(layer_param, bottom_shapes)
        warnings.warn(
            NativeSubstituteWarning(
                f"layer '{layer_param.name}' (Python): {layer.extra_repr()}; {RUN_MODULE_HINT}"
            ),
            stacklevel=2,
        )
        return layer

    def __init__(self, layer_param: caffe_pb2.LayerParameter, bottom_shapes: Sequence[Shape]):
        super().__init__(layer_param, bottom_shapes)
        if not python_layers_allowed():
            raise self.error(
                f"refusing to run Python layer {layer_param.python_param.module}."
                f"{layer_param.python_param.layer}",
                hint=OPT_IN_HINT,
                cls=TrustError,
            )
        cls = import_layer_class(layer_param)
        try:
            self.py = cls(layer_param)
            self.py.param_str = layer_param.python_param.param_str
            # rbgirshick/caffe-fast-rcnn names it param_str_; py-faster-rcnn's layers read that.
            self.py.param_str_ = self.py.param_str
            # An int as in BVLC; named as caffe-fast-rcnn's enum, which py-faster-rcnn reads.
            self.py.phase = Phase(layer_param.phase)
            self._bottoms = [Blob(s) for s in self.bottom_shapes]
            self._tops = [self._own_top(i) for i in range(self.num_tops)]
            self.py.setup(self._bottoms, self._tops)
            self.py.reshape(self._bottoms, self._tops)
        except TorchCaffeError:
            raise
        except Exception as err:  # the user's code: its own exception, located by a note
            raise self._noted(err, "setup") from None
        self._set_up_shapes = [t.shape for t in self._tops]
        self._adopt_blobs()
        # follows .to(): the device and dtype of a bottomless layer's tops (a data layer)
        self.register_buffer("_like", torch.zeros(0), persistent=False)

    def _own_top(self, i: int) -> Blob:
        """Top ``i``'s Blob: in place (the same name as bottom ``i``), the bottom's Blob
        itself, as Caffe's Net::AppendTop gives an in-place layer its bottom blob as the top;
        the class may then compute in either, and its backward finds the top diff in the
        bottom's."""
        bottoms, tops = self.layer_param.bottom, self.layer_param.top
        if i < len(bottoms) and tops[i] == bottoms[i]:
            return self._bottoms[i]
        return Blob()

    # The prototxt the layer came from, for error notes (set by the pycaffe Net).
    source_path: str | None = None
    # The top shapes SetUp left, for the net builder's output_shapes call that follows it.
    _set_up_shapes: list[Shape] | None = None

    def _noted(self, err: BaseException, stage: str) -> BaseException:
        pp = self.layer_param.python_param
        where = f"{self.source_path}: " if self.source_path else ""
        return note_user_error(
            err,
            f"{where}layer '{self.name}' (Python, {pp.module}.{pp.layer}): raised in {stage}",
        )

    def _adopt_blobs(self) -> None:
        """The class's ``self.blobs`` become parameters on the Blobs' own memory, so a numpy
        view the class took in ``setup`` (``self.w = self.blobs[0].data``) sees loaded weights
        and updates, as in Caffe, where the net's params are the layer's blobs."""
        for i, blob in enumerate(getattr(self.py, "blobs", [])):
            param = self.add_blob(f"blob{i}", blob.shape)
            param.data = blob.mutable_cpu_data()

    def grads_on_blob_diffs(self) -> None:
        """Called by a pycaffe Net before it binds the params: a param without a gradient
        takes its Blob's diff memory as ``.grad``, the diff the net's param Blob then shows,
        so a diff view the class took in ``setup`` is the param's diff."""
        for blob, param in zip(getattr(self.py, "blobs", []), self.param_blobs()):
            diff = blob.mutable_cpu_diff()
            if param.grad is None and (param.dtype, param.device) == (diff.dtype, diff.device):
                param.grad = diff

    def share_param_diffs(self, blobs: Sequence[Blob]) -> None:
        """Called by a pycaffe Net: the class's ``self.blobs`` take the diff memory of the net's
        param Blobs, as in Caffe, where a layer's blobs are the net's params. Its ``backward``
        then writes (or adds to) the params' diffs itself, as it finds them: a diff it sets
        replaces what an earlier backward (``iter_size``, a shared param) left there."""
        self._net_param_blobs = list(blobs)
        for mine, net_blob in zip(getattr(self.py, "blobs", []), blobs):
            mine.share_diff(net_blob)

    # The pycaffe Net's param Blobs whose diffs the class's blobs share (share_param_diffs).
    _net_param_blobs: list[Blob] | None = None

    def set_param_blob(self, index: int, tensor: torch.Tensor) -> None:
        super().set_param_blob(index, tensor)
        self.py.blobs[index].set_cpu_data(tensor.detach())

    def _sync_blobs_to_params(self) -> None:
        """After ``.to()`` moved the params, point the user's Blobs at host copies."""
        for blob, param in zip(getattr(self.py, "blobs", []), self.param_blobs()):
            host = param.detach()
            if host.dtype == torch.bfloat16:  # a float32 copy numpy can read
                host = _host(host)
            blob.set_cpu_data(host if host.device.type == "cpu" else host.to("cpu"))

    # -- the numpy round trips ---------------------------------------------------------------
    # run_forward calls so far: a backward whose forward was not the last one restores the
    # Blobs first (the torch face may run a net twice, then backward through both)
    forward_runs = 0

    def restore_blobs(self, bottoms: Sequence[torch.Tensor], tops: Sequence[torch.Tensor]) -> None:
        """Put an earlier forward's bottoms and tops back into the Blobs the class reads."""
        for blob, tensor in zip(self._bottoms, bottoms):
            _fill(blob, tensor)
        for blob, tensor in zip(self._tops, tops):
            blob.reshape(tuple(tensor.shape))
            blob.data[...] = _host(tensor).numpy()
        self.forward_runs += 1

    def run_forward(self, bottoms: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        self.forward_runs += 1
        self._sync_blobs_to_params()
        for blob, tensor in zip(self._bottoms, bottoms):
            _fill(blob, tensor)
        try:
            self.py.reshape(self._bottoms, self._tops)
            self.py.forward(self._bottoms, self._tops)
        except TorchCaffeError as err:
            raise err.located(layer=self.name, layer_type=self.caffe_type) from None
        except Exception as err:
            if not from_user_code(err):
                raise self._noted(err, "forward") from None
            raise
        like: torch.Tensor = bottoms[0] if bottoms else self._like  # type: ignore[assignment]
        device, dtype = like.device, like.dtype
        return tuple(torch.from_numpy(t.data.copy()).to(device, dtype) for t in self._tops)

    def run_backward(
        self, grads: Sequence[torch.Tensor], wanted: Sequence[bool]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """The user's ``backward``; (bottom diffs, param diffs). In a pycaffe Net the class
        writes the param diffs in place (share_param_diffs) and their entries are None."""
        for top, grad in zip(self._tops, grads):
            top.diff[...] = _host(grad).numpy()
        for blob in self._bottoms:
            if not any(blob is top for top in self._tops):  # an in-place one holds the top diff
                blob.diff[...] = 0
        blobs = getattr(self.py, "blobs", [])
        in_place = self._net_param_blobs is not None
        if in_place:
            self.share_param_diffs(self._net_param_blobs or [])
        else:
            for blob in blobs:
                blob.diff[...] = 0
        try:
            self.py.backward(self._tops, list(wanted), self._bottoms)
        except TorchCaffeError as err:
            raise err.located(layer=self.name, layer_type=self.caffe_type) from None
        except Exception as err:
            if not from_user_code(err):
                raise self._noted(err, "backward") from None
            raise
        bottom_diffs = [torch.from_numpy(b.diff.copy()) for b in self._bottoms]
        param_diffs: list[torch.Tensor | None] = [
            None if in_place else torch.from_numpy(b.diff.copy()).to(p.dtype)
            for b, p in zip(blobs, self.param_blobs())
        ]
        return bottom_diffs, param_diffs

    def forward(self, *bottoms: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        params = self.param_blobs()
        tracked = torch.is_grad_enabled() and any(t.requires_grad for t in (*bottoms, *params))
        if tracked:
            tops = _PythonFunction.apply(self, len(bottoms), *bottoms, *params)
        else:
            tops = self.run_forward(bottoms)
        return tops[0] if len(tops) == 1 else tuple(tops)

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        """Caffe's Reshape, on the layer's own Blobs: a top ``reshape`` leaves alone keeps its
        shape. The first call, the net builder's right after construction, gets the shapes
        SetUp left: Caffe's SetUp calls ``reshape`` once, and a ``reshape`` may have effects."""
        shapes, self._set_up_shapes = self._set_up_shapes, None
        wanted = [tuple(int(d) for d in s) for s in bottom_shapes]
        if shapes is not None and wanted == [b.shape for b in self._bottoms]:
            return shapes
        for blob, shape in zip(self._bottoms, wanted):
            blob.reshape(shape)
        try:
            self.py.reshape(self._bottoms, self._tops)
        except TorchCaffeError:
            raise
        except Exception as err:
            raise self._noted(err, "reshape") from None
        return [t.shape for t in self._tops]

    def extra_repr(self) -> str:
        pp = self.layer_param.python_param
        return f"module={pp.module!r}, layer={pp.layer!r}, param_str={pp.param_str!r}"
