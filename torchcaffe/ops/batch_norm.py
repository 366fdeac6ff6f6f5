"""BatchNorm: normalize each channel by batch or stored statistics (no scale/shift)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..errors import UnsupportedError
from ..proto import caffe_pb2
from ..registry import register_layer
from ._derived import DerivedCache
from ._launches import launch_bound
from ._narrow import is_narrow
from ._transforms import refuse_stats_update, stats_update_refused, under_func_transform
from .base import CaffeLayer, Shape


@register_layer("BatchNorm")
class BatchNormLayer(CaffeLayer):
    """y = (x - mean) / sqrt(var + eps) per channel (axis 1). Caffe type ``BatchNorm``,
    ``batch_norm_param`` (use_global_stats: phase == TEST, moving_average_fraction = .999,
    eps = 1e-5).

    Three blobs, buffers (Caffe masks them from the solver): ``mean`` (C,), ``variance``
    (C,), ``scale_factor`` (1,). Batch statistics (mean and biased variance over every axis
    but 1) also update them: scale_factor = scale_factor * maf + 1, mean = mean * maf +
    batch_mean, variance = variance * maf + m / (m - 1) * batch_var with m = count / C (factor
    1 when m == 1). Global statistics are the blobs times 1 / scale_factor (0 when it is 0).
    Without ``use_global_stats`` in the prototxt, ``self.training`` (from the phase, or
    ``train()`` / ``eval()``) picks batch or global statistics.
    Differs from torch: running sums with a scale factor instead of running averages; the
    stored variance is unbiased, the normalizing one biased; no affine part (see Scale).
    """

    param_field = "batch_norm_param"
    restrictions = (
        "brocolli's use_alpha_beta (affine BatchNorm) and a negative eps are not supported"
    )

    # param blobs, registered by add_blob
    mean: torch.Tensor
    variance: torch.Tensor
    scale_factor: torch.Tensor

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        p = self.param
        shape = self.bottom_shapes[0]
        if len(shape) < 2:
            # Caffe sets channels = 1 for a 1-D bottom, then its Reshape reads shape(1)
            # and aborts.
            raise self.error(
                "bottom must have at least 2 axes (N, C, ...)",
                expected="num_axes >= 2",
                got=len(shape),
            )
        self._check_param(p, layer_param)
        self.use_global_stats = p.use_global_stats if p.HasField("use_global_stats") else None
        self.moving_average_fraction = p.moving_average_fraction
        self.eps = p.eps
        if self.eps < 0:  # torch's batch-norm kernels refuse it, mid-forward
            raise self.error(
                "a negative eps is not supported",
                expected="eps >= 0",
                got=self.eps,
                cls=UnsupportedError,
                hint="Caffe adds eps to the variance and takes its square root as is",
            )
        channels = shape[1]
        self.add_blob("mean", (channels,), learnable=False)
        self.add_blob("variance", (channels,), learnable=False)
        self.add_blob("scale_factor", (1,), learnable=False)
        self.stats_cache: DerivedCache[tuple[torch.Tensor, torch.Tensor]] = DerivedCache()

    def _apply(self, fn, recurse: bool = True):  # type: ignore[no-untyped-def]
        """nn.Module's ``.to()`` / ``.half()``, keeping the statistics float32 where the
        layer becomes float16/bfloat16: their running sums (scale_factor near 1000, mean and
        variance sums 1000 times the statistics) pass 65504 in float16 (the variance became
        inf) and stop growing in bfloat16 (0.999 rounds to 1, 256 + 1 to 256), where Caffe's
        float ones converge. The layer casts what it reads to the bottom's dtype."""
        kept = {name: self._buffers[name] for name in ("mean", "variance", "scale_factor")}
        out = super()._apply(fn, recurse)
        for name, old in kept.items():
            new = self._buffers[name]
            if old is not None and new is not None and is_narrow(new.dtype):
                self._buffers[name] = old.to(device=new.device, dtype=torch.float32)
        return out

    def _check_param(self, p, layer_param) -> None:
        """BVLC's checks: no affine part, and the statistics masked from the solver."""
        if p.use_alpha_beta:
            raise self.error(
                "use_alpha_beta (brocolli's affine BatchNorm) is not supported",
                expected="use_alpha_beta: false",
                got=True,
                cls=UnsupportedError,
                hint="follow the BatchNorm with a Scale layer (bias_term: true), "
                "or use brocolli's type BatchNormKyle",
            )
        for i, spec in enumerate(layer_param.param[:3]):
            if spec.lr_mult != 0:
                raise self.error(
                    "cannot configure batch normalization statistics as layer "
                    f"parameters (param {i} has a nonzero lr_mult)",
                    expected="lr_mult: 0 or no param spec",
                    got=spec.lr_mult,
                )

    def complete_param(self, lp: caffe_pb2.LayerParameter) -> None:
        """BatchNormLayer::LayerSetUp masks the statistics from the solver: a ParamSpec with
        lr_mult 0 for each of the 3 blobs the prototxt gave none."""
        while len(lp.param) < 3:
            lp.param.add().lr_mult = 0.0

    @property
    def uses_global_stats(self) -> bool:
        """Caffe's use_global_stats_: the prototxt's value, else whether testing."""
        if self.use_global_stats is not None:
            return self.use_global_stats
        return not self.training

    def output_shapes(self, bottom_shapes: Sequence[Shape]) -> list[Shape]:
        shape = tuple(int(d) for d in bottom_shapes[0])
        self._check_bottom(shape)
        return [shape]

    def _check_bottom(self, shape: Sequence[int]) -> None:
        channels = self.mean.shape[0]
        if len(shape) < 2 or shape[1] != channels:
            raise self.error(
                "bottom channels (axis 1) differ from the statistics blobs",
                expected=f"shape (N, {channels}, ...)",
                got=list(shape),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._normalize(x)

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        """(x - mean) / sqrt(var + eps) on torch's fused batch-norm kernel.

        Shapes were checked once by ``output_shapes`` (the net's ``infer_shapes``).
        """
        if self.uses_global_stats:
            mean, var = self.global_stats()
            if torch.jit.is_tracing():
                # broadcast arithmetic: torch.onnx's TorchScript exporter refuses a batch_norm
                # whose bottom's channel count its shape inference lost (a Convolution over a
                # Slice top: 38 of 300 random nets)
                return self._caffe_normalize(x, mean.to(x.dtype), var.to(x.dtype))
            return F.batch_norm(x, mean.to(x.dtype), var.to(x.dtype), eps=self.eps)
        if torch.onnx.is_in_onnx_export():
            # ONNX's BatchNormalization in training mode: onnxruntime's inference kernel
            # normalizes by the (zero) running statistics it is given instead, silently
            # (ResNet blocks with use_global_stats: false, dynamo exporter: off by 3e8).
            # The graph is inference: the statistics the export's trace sees are not kept.
            return self._caffe_normalize(x, *self._batch_stats(x))
        refuse_stats_update(self)
        m = x.numel() // x.shape[1]
        if m <= 1:  # torch's unbiased variance divides by m - 1; Caffe's factor is then 1
            return self._normalize_single(x)
        if self.eps <= 0:  # Caffe takes eps 0 (sqrt(var)); torch's kernel refuses it
            mean, var = self._batch_stats(x)
            self._update_stats(mean.detach(), var.detach() * (m / (m - 1)))
            return self._caffe_normalize(x, mean, var)
        # momentum 1 makes the kernel store the batch mean and unbiased variance (m / (m - 1)
        # times the biased one) in these buffers: exactly Caffe's update terms.
        batch_mean = torch.zeros(x.shape[1], dtype=x.dtype, device=x.device)
        batch_var = torch.zeros_like(batch_mean)
        y = F.batch_norm(x, batch_mean, batch_var, training=True, momentum=1.0, eps=self.eps)
        self._update_stats(batch_mean, batch_var)
        return y

    def _caffe_normalize(
        self, x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor
    ) -> torch.Tensor:
        """Caffe's arithmetic, (x - mean) / sqrt(var + eps), with per-channel (C,) ``mean``
        and ``var`` broadcast over the other axes."""
        view = (1, -1) + (1,) * (x.dim() - 2)
        return (x - mean.reshape(view)) / torch.sqrt(var + self.eps).reshape(view)

    def global_stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored statistics times 1 / scale_factor (0 when it is 0), as Caffe reads them.

        On the CPU a factor of exactly 1 (every deploy net's) returns the blobs themselves, as
        ``nn.BatchNorm2d`` passes its buffers: x * 1 == x, and a forward under autograd
        (no fold) skips five small ops per layer (5.7 -> 0.4 us, one thread). Elsewhere
        reading the factor would sync with the device, so the scaled statistics are cached
        on the blobs' versions (``stats_cache``): five kernel launches per BatchNorm and
        forward fewer, 265 in ResNet-50's training forward on a GPU.
        """
        stored = self.scale_factor
        if launch_bound(stored):
            sources = (self.mean, self.variance, stored)
            return self.stats_cache.get(sources, self._scaled_stats)
        if (
            stored.is_cpu
            and not torch.compiler.is_compiling()
            and not under_func_transform()  # which reads no value
            and stored.item() == 1.0
        ):
            return self.mean, self.variance
        return self._scaled_stats()

    def _scaled_stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        return scaled_stats(self.mean, self.variance, self.scale_factor)

    def _normalize_single(self, x: torch.Tensor) -> torch.Tensor:
        """Batch statistics over one value per channel (variance 0, Caffe's correction 1)."""
        mean, var = self._batch_stats(x)
        self._update_stats(mean.detach(), var.detach())
        return self._caffe_normalize(x, mean, var)

    @staticmethod
    def _batch_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel mean and biased variance over every axis but 1, as Caffe computes."""
        dims = [0] + list(range(2, x.dim()))
        mean = x.mean(dim=dims)
        centered = x - mean.reshape((1, -1) + (1,) * (x.dim() - 2))
        return mean, (centered * centered).mean(dim=dims)

    @torch.no_grad()
    def _update_stats(self, mean: torch.Tensor, unbiased_var: torch.Tensor) -> None:
        maf = self.moving_average_fraction
        try:
            self.scale_factor.mul_(maf).add_(1)
        except RuntimeError as err:  # before any write: a transform captured the buffers
            if not under_func_transform():
                raise
            raise stats_update_refused(self) from err
        self.mean.mul_(maf).add_(mean.to(self.mean.dtype))
        self.variance.mul_(maf).add_(unbiased_var.to(self.variance.dtype))


def scaled_stats(
    mean: torch.Tensor, variance: torch.Tensor, stored: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The stored statistics as Caffe reads them: times 1 / scale_factor, 0 when it is 0.
    Small ops (device tensors: no host sync); a NaN factor stays NaN, as in Caffe. The 0 is
    ``|stored|``, not a filled constant: inductor's freezing folds only what derives from the
    params alone (a fill's constant made every folded BatchNorm's weights per-call work)."""
    factor = torch.where(stored != 0, stored.reciprocal(), stored.abs())
    return mean * factor, variance * factor
