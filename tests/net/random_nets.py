"""Random small Caffe nets for differential tests of the passes.

Each net is a seeded random DAG over one Input: convolutions (grouped, depthwise, dilated,
strided; siblings of one geometry over one bottom), deconvolutions, inner products,
BatchNorm/Scale/Bias chains after them (the folds' patterns), activations in place or not,
pooling, LRN, Eltwise (two or three bottoms), Concat (channels or height), Slice, Flatten,
Reshape, Softmax, ELU, AbsVal, Dropout and Power; with ``wide`` also the rest of the
catalogue that a random DAG can hold: BVLC's Crop, Tile, Reduction, MVN, Clip, Swish,
Threshold, BNLL, Exp and the forks' ReLU6, HardSwish, HardSigmoid, Normalize,
ShuffleChannel, Upsample, Interp, Pad, PixelShuffle, Permute, Axpy, DepthwiseConvolution.
Shapes follow Caffe's arithmetic so every generated net is valid; blobs read by several layers
get Caffe's Splits, and the unread tops are the net's outputs.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from google.protobuf import text_format

import torchcaffe
from torchcaffe.proto import caffe_pb2

Shape = tuple[int, ...]


@dataclass
class RandomNet:
    """The prototxt text, the input's shape and what the generator put in."""

    text: str
    input_shape: Shape
    types: set[str] = field(default_factory=set)


class _Builder:
    def __init__(self, rng: random.Random, batch: int) -> None:
        self.rng = rng
        self.lines: list[str] = []
        self.shapes: dict[str, Shape] = {}
        self.order: list[str] = []  # blob names, newest last
        self.read: set[str] = set()  # blobs whose current value some layer reads
        self.types: set[str] = set()
        self.count = 0
        c = rng.choice([1, 2, 3, 4, 8])
        h, w = rng.randint(4, 12), rng.randint(4, 12)
        self.input_shape = (batch, c, h, w)
        self._add_blob("data", self.input_shape)

    def _add_blob(self, name: str, shape: Shape) -> None:
        self.read.discard(name)  # a new value that nobody has read
        self.shapes[name] = shape
        if name in self.order:
            self.order.remove(name)
        self.order.append(name)

    def _name(self, kind: str) -> str:
        self.count += 1
        return f"{kind}{self.count}"

    def pick(self, want_4d: bool | None = None) -> str:
        """Mostly the newest blob, sometimes an older one."""
        names = [n for n in self.order if want_4d is None or (len(self.shapes[n]) == 4) == want_4d]
        if not names:
            return self.order[-1]
        if self.rng.random() < 0.7:
            return names[-1]
        return self.rng.choice(names)

    def layer(
        self, kind: str, bottoms: list[str], shape: Shape, params: str = "", in_place: bool = False
    ) -> str:
        name = self._name(kind.lower())
        # Caffe's splits give a blob read by several layers one copy per reader, so a layer
        # may work in place only on a blob no other layer has read yet
        in_place = in_place and bottoms[0] not in self.read
        self.read.update(bottoms)
        top = bottoms[0] if in_place else name
        self.types.add(kind)
        b = " ".join(f'bottom: "{x}"' for x in bottoms)
        self.lines.append(f'layer {{ name: "{name}" type: "{kind}" {b} top: "{top}" {params} }}')
        self._add_blob(top, shape)
        return top

    # -- layers ----------------------------------------------------------------------------
    def convolution(self, bottom: str) -> str | None:
        n, c, h, w = self.shapes[bottom]
        rng = self.rng
        k = rng.choice([1, 3, 3])
        dilation = rng.choice([1, 1, 2]) if k == 3 else 1
        pad = rng.choice([0, 1]) if k == 3 else 0
        stride = rng.choice([1, 1, 2])
        extent = dilation * (k - 1) + 1
        oh, ow = (h + 2 * pad - extent) // stride + 1, (w + 2 * pad - extent) // stride + 1
        if oh < 1 or ow < 1:
            return None
        num = rng.choice([2, 3, 4, 8])
        group = 1
        if c > 1 and rng.random() < 0.3:
            group, num = c, c  # depthwise
        elif c % 2 == 0 and num % 2 == 0 and rng.random() < 0.3:
            group = 2
        bias = rng.choice(["true", "false"])
        p = (
            f"convolution_param {{ num_output: {num} kernel_size: {k} pad: {pad} "
            f"stride: {stride} dilation: {dilation} group: {group} bias_term: {bias} }}"
        )
        return self.layer("Convolution", [bottom], (n, num, oh, ow), p)

    def siblings(self, bottom: str) -> str | None:
        """Two or three convolutions of one geometry over ``bottom`` (an inception module's
        branches), each followed by the same ReLU, by a BatchNorm chain, or by nothing."""
        rng = self.rng
        n, c, h, w = self.shapes[bottom]
        k = rng.choice([1, 1, 3])
        pad, stride = (rng.choice([0, 1]), rng.choice([1, 2])) if k == 3 else (0, 1)
        oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        if oh < 1 or ow < 1:
            return None
        after = rng.choice(["relu", "relu", "chain", "none"])
        top = None
        for _ in range(rng.choice([2, 3])):
            num = rng.choice([2, 3, 5])
            bias = rng.choice(["true", "false"])
            p = (
                f"convolution_param {{ num_output: {num} kernel_size: {k} pad: {pad} "
                f"stride: {stride} bias_term: {bias} }}"
            )
            top = self.layer("Convolution", [bottom], (n, num, oh, ow), p)
            if after == "relu":
                top = self.layer("ReLU", [top], self.shapes[top], in_place=True)
            elif after == "chain":
                top = self.affine_chain(top)
        return top

    def deconvolution(self, bottom: str) -> str | None:
        n, c, h, w = self.shapes[bottom]
        k, stride = self.rng.choice([2, 3]), self.rng.choice([1, 2])
        pad = self.rng.choice([0, 1]) if k == 3 else 0
        oh, ow = stride * (h - 1) + k - 2 * pad, stride * (w - 1) + k - 2 * pad
        if oh < 1 or ow < 1 or oh * ow > 400:
            return None
        num = self.rng.choice([2, 4])
        bias = self.rng.choice(["true", "false"])
        p = (
            f"convolution_param {{ num_output: {num} kernel_size: {k} pad: {pad} "
            f"stride: {stride} bias_term: {bias} }}"
        )
        return self.layer("Deconvolution", [bottom], (n, num, oh, ow), p)

    def inner_product(self, bottom: str) -> str:
        num = self.rng.choice([3, 5, 8])
        bias = self.rng.choice(["true", "false"])
        p = f"inner_product_param {{ num_output: {num} bias_term: {bias} }}"
        return self.layer("InnerProduct", [bottom], (self.shapes[bottom][0], num), p)

    def affine_chain(self, bottom: str) -> str:
        """BatchNorm (sometimes frozen: global statistics in training too), then Scale (with
        or without bias) or Bias, then maybe a ReLU: the chains the folds look for, each link
        in place or not."""
        shape = self.shapes[bottom]
        rng = self.rng
        frozen = "batch_norm_param { use_global_stats: true }" if rng.random() < 0.3 else ""
        top = self.layer("BatchNorm", [bottom], shape, frozen, in_place=rng.random() < 0.6)
        if rng.random() < 0.8:
            bias = rng.choice(["true", "false"])
            p = f"scale_param {{ bias_term: {bias} }}"
            top = self.layer("Scale", [top], shape, p, in_place=rng.random() < 0.7)
        elif rng.random() < 0.5:
            top = self.layer("Bias", [top], shape, in_place=rng.random() < 0.7)
        if rng.random() < 0.7:
            top = self.activation(top, kinds=["ReLU"])
        return top

    def activation(self, bottom: str, kinds: list[str] | None = None) -> str:
        rng = self.rng
        kind = rng.choice(kinds or ["ReLU", "ReLU", "PReLU", "Sigmoid", "TanH", "Power"])
        p = ""
        if kind == "ReLU" and rng.random() < 0.3:
            p = "relu_param { negative_slope: 0.1 }"
        elif kind == "PReLU":
            p = f"prelu_param {{ channel_shared: {rng.choice(['true', 'false'])} }}"
        elif kind == "Power":
            p = f"power_param {{ power: {rng.choice([1, 2])} scale: 0.5 shift: 0.25 }}"
        return self.layer(kind, [bottom], self.shapes[bottom], p, in_place=rng.random() < 0.6)

    def pooling(self, bottom: str) -> str | None:
        n, c, h, w = self.shapes[bottom]
        rng = self.rng
        pool = rng.choice(["MAX", "AVE"])
        if rng.random() < 0.2:
            p = f"pooling_param {{ pool: {pool} global_pooling: true }}"
            return self.layer("Pooling", [bottom], (n, c, 1, 1), p)
        k, stride = rng.choice([2, 3]), rng.choice([1, 2])
        pad = rng.choice([0, 1])
        oh, ow = _pooled(h, k, stride, pad), _pooled(w, k, stride, pad)
        if oh < 1 or ow < 1 or k > h + 2 * pad or k > w + 2 * pad:
            return None
        p = f"pooling_param {{ pool: {pool} kernel_size: {k} stride: {stride} pad: {pad} }}"
        return self.layer("Pooling", [bottom], (n, c, oh, ow), p)

    def lrn(self, bottom: str) -> str:
        if self.rng.random() < 0.7:
            p = f"lrn_param {{ local_size: {self.rng.choice([3, 5])} alpha: 0.5 beta: 0.75 }}"
        else:
            p = "lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 norm_region: WITHIN_CHANNEL }"
        return self.layer("LRN", [bottom], self.shapes[bottom], p)

    def eltwise(self, bottom: str) -> str | None:
        shape = self.shapes[bottom]
        others = [n for n in self.order if n != bottom and self.shapes[n] == shape]
        if not others:
            return None
        other = self.rng.choice(others)
        bottoms = [bottom, other]
        if len(others) > 1 and self.rng.random() < 0.3:
            bottoms.append(self.rng.choice([n for n in others if n != other]))
        op = self.rng.choice(["SUM", "SUM", "PROD", "MAX"])
        p = f"eltwise_param {{ operation: {op} }}"
        if op == "SUM" and self.rng.random() < 0.4:
            coeffs = " ".join(f"coeff: {c}" for c in (0.5, -1.5, 2.0)[: len(bottoms)])
            p = f"eltwise_param {{ operation: SUM {coeffs} }}"
        return self.layer("Eltwise", bottoms, shape, p)

    def concat(self, bottom: str) -> str | None:
        shape = self.shapes[bottom]
        others = [
            n
            for n in self.order
            if n != bottom
            and len(self.shapes[n]) == len(shape)
            and self.shapes[n][:1] + self.shapes[n][2:] == shape[:1] + shape[2:]
        ]
        if not others:
            return None
        other = self.rng.choice(others)
        channels = shape[1] + self.shapes[other][1]
        if len(shape) == 4 and self.shapes[other] == shape and self.rng.random() < 0.3:
            p = "concat_param { axis: 2 }"  # along the height
            return self.layer(
                "Concat", [bottom, other], (shape[0], shape[1], 2 * shape[2], shape[3]), p
            )
        return self.layer("Concat", [bottom, other], (shape[0], channels, *shape[2:]))

    def view(self, bottom: str) -> str:
        """Flatten or Reshape: views of Caffe's NCHW order, whatever layout the bottom has."""
        shape = self.shapes[bottom]
        flat = (shape[0], math.prod(shape[1:]))
        if len(shape) != 4 or self.rng.random() < 0.5:
            return self.layer("Flatten", [bottom], flat)
        n, c, h, w = shape
        p = f"reshape_param {{ shape {{ dim: 0 dim: -1 dim: {w} }} }}"
        return self.layer("Reshape", [bottom], (n, c * h, w), p)

    def slice(self, bottom: str) -> str | None:
        """Slice along the channels into two tops (both stay available)."""
        shape = self.shapes[bottom]
        if shape[1] < 2:
            return None
        point = self.rng.randint(1, shape[1] - 1)
        name = self._name("slice")
        tops = [f"{name}a", f"{name}b"]
        self.types.add("Slice")
        self.read.add(bottom)
        self.lines.append(
            f'layer {{ name: "{name}" type: "Slice" bottom: "{bottom}" top: "{tops[0]}" '
            f'top: "{tops[1]}" slice_param {{ axis: 1 slice_point: {point} }} }}'
        )
        self._add_blob(tops[0], (shape[0], point, *shape[2:]))
        self._add_blob(tops[1], (shape[0], shape[1] - point, *shape[2:]))
        return tops[self.rng.randint(0, 1)]

    def pointwise(self, bottom: str) -> str:
        """Softmax over the channels, ELU or AbsVal (layers the layout pass hands NCHW)."""
        kind = self.rng.choice(["Softmax", "ELU", "AbsVal"])
        in_place = kind == "ELU" and self.rng.random() < 0.5  # Caffe's AbsVal refuses it
        return self.layer(kind, [bottom], self.shapes[bottom], in_place=in_place)

    def dropout(self, bottom: str) -> str:
        p = "dropout_param { dropout_ratio: 0.3 }"
        return self.layer("Dropout", [bottom], self.shapes[bottom], p, in_place=True)

    # -- the wider catalogue (``random_net(wide=True)``): BVLC's other layers and forks' --
    def wide_pointwise(self, bottom: str) -> str:
        """A shape-keeping layer from the rest of the catalogue, in place where Caffe allows."""
        rng = self.rng
        kind, p = rng.choice(
            [
                ("ReLU6", "relu6_param { negative_slope: 0.1 threshold: 1.5 }"),
                ("ReLU6", ""),
                ("HardSwish", ""),
                ("HardSigmoid", "hardsigmoid_param { alpha: 0.3 beta: 0.4 }"),
                ("Swish", "swish_param { beta: 1.5 }"),
                ("BNLL", ""),
                ("Clip", "clip_param { min: -0.5 max: 0.75 }"),
                ("Threshold", "threshold_param { threshold: 0.1 }"),
                ("Exp", "exp_param { base: 2 scale: 0.5 shift: -0.25 }"),
                ("TanH", ""),
            ]
        )
        # HardSwish and BNLL keep a copy of the bottom for their backward in some forks
        in_place = kind in ("ReLU6", "Clip", "TanH", "Swish") and rng.random() < 0.5
        return self.layer(kind, [bottom], self.shapes[bottom], p, in_place=in_place)

    def wide_normalize(self, bottom: str) -> str:
        """MVN, SSD's Normalize (learned scale) or a ShuffleChannel: per-sample arithmetic
        over channels and positions, shape kept."""
        rng = self.rng
        shape = self.shapes[bottom]
        kind = rng.choice(["MVN", "Normalize", "ShuffleChannel"])
        if kind == "ShuffleChannel":
            groups = [g for g in (2, 3, 4) if shape[1] % g == 0 and shape[1] > g]
            if not groups or len(shape) != 4:
                kind = "MVN"
            else:
                p = f"shuffle_channel_param {{ group: {rng.choice(groups)} }}"
                return self.layer(kind, [bottom], shape, p)
        if kind == "Normalize" and len(shape) == 4:
            spatial = rng.choice(["true", "false"])
            shared = rng.choice(["true", "false"])
            p = f"norm_param {{ across_spatial: {spatial} channel_shared: {shared} }}"
            return self.layer(kind, [bottom], shape, p)
        variance = rng.choice(["true", "false"])
        channels = rng.choice(["true", "false"])
        p = f"mvn_param {{ normalize_variance: {variance} across_channels: {channels} }}"
        # Caffe's MVN shapes its top by the legacy (num, channels, height, width): 4 axes
        return self.layer("MVN", [bottom], shape + (1,) * (4 - len(shape)), p)

    def wide_resize(self, bottom: str) -> str | None:
        """Spatial size changes: Upsample, Interp, Pad, PixelShuffle or a Crop to a smaller
        blob of the same channels."""
        rng = self.rng
        n, c, h, w = self.shapes[bottom]
        kind = rng.choice(["Upsample", "Interp", "Pad", "PixelShuffle", "Crop"])
        if kind == "Upsample" and h * w <= 100:
            return self.layer(
                "Upsample", [bottom], (n, c, 2 * h, 2 * w), "upsample_param { scale: 2 }"
            )
        if kind == "Interp" and h > 1 and w > 1:
            oh, ow = rng.randint(2, 14), rng.randint(2, 14)
            p = f"interp_param {{ height: {oh} width: {ow} }}"
            return self.layer("Interp", [bottom], (n, c, oh, ow), p)
        if kind == "Pad":
            mode = rng.choice(["CONSTANT", "REPLICATE", "REFLECT"])
            u, d, left, r = (rng.randint(0, 2) for _ in range(4))
            if mode == "REFLECT" and max(u, d) >= h or mode == "REFLECT" and max(left, r) >= w:
                mode = "CONSTANT"
            p = f"pad_param {{ pad_type: {mode} pad_u: {u} pad_d: {d} pad_l: {left} pad_r: {r} }}"
            return self.layer("Pad", [bottom], (n, c, h + u + d, w + left + r), p)
        if kind == "PixelShuffle" and c % 4 == 0:
            p = "pixelshuffle_param { upscale_factor: 2 }"
            return self.layer("PixelShuffle", [bottom], (n, c // 4, 2 * h, 2 * w), p)
        smaller = [
            m
            for m in self.order
            if len(self.shapes[m]) == 4
            and self.shapes[m][:2] == (n, c)
            and self.shapes[m][2] <= h
            and self.shapes[m][3] <= w
            and m != bottom
        ]
        if not smaller:
            return None
        ref = rng.choice(smaller)
        rh, rw = self.shapes[ref][2:]
        oh, ow = rng.randint(0, h - rh), rng.randint(0, w - rw)
        p = f"crop_param {{ axis: 2 offset: {oh} offset: {ow} }}"
        return self.layer("Crop", [bottom, ref], (n, c, rh, rw), p)

    def wide_reshape(self, bottom: str) -> str | None:
        """Permute (SSD's NHWC order), Tile, Reduction over the trailing axes, or a Softmax
        along an axis other than the channels."""
        rng = self.rng
        shape = self.shapes[bottom]
        kind = rng.choice(["Permute", "Tile", "Reduction", "Softmax"])
        if kind == "Permute" and len(shape) == 4:
            n, c, h, w = shape
            p = "permute_param { order: 0 order: 2 order: 3 order: 1 }"
            return self.layer("Permute", [bottom], (n, h, w, c), p)
        if kind == "Tile" and math.prod(shape) <= 800:
            axis = rng.randint(1, len(shape) - 1)
            tiled = tuple(d * 2 if i == axis else d for i, d in enumerate(shape))
            return self.layer("Tile", [bottom], tiled, f"tile_param {{ axis: {axis} tiles: 2 }}")
        if kind == "Reduction" and len(shape) > 2:
            op = rng.choice(["SUM", "ASUM", "SUMSQ", "MEAN"])
            p = f"reduction_param {{ operation: {op} axis: 2 coeff: 0.5 }}"
            return self.layer("Reduction", [bottom], shape[:2], p)
        axis = len(shape) - 1
        return self.layer("Softmax", [bottom], shape, f"softmax_param {{ axis: {axis} }}")

    def wide_gate(self, bottom: str) -> str | None:
        """SENet's gate: a global pooling, then Axpy(gate, x, y) with y of x's shape."""
        shape = self.shapes[bottom]
        if len(shape) != 4:
            return None
        n, c = shape[:2]
        gate = self.layer(
            "Pooling", [bottom], (n, c, 1, 1), "pooling_param { pool: AVE global_pooling: true }"
        )
        gate = self.layer("Sigmoid", [gate], (n, c, 1, 1))
        others = [m for m in self.order if self.shapes[m] == shape and m != bottom]
        y = self.rng.choice(others) if others else bottom
        return self.layer("Axpy", [gate, bottom, y], shape)

    def wide_convolution(self, bottom: str) -> str | None:
        """A grouped Deconvolution or the forks' DepthwiseConvolution."""
        rng = self.rng
        n, c, h, w = self.shapes[bottom]
        if c < 2:
            return None
        if rng.random() < 0.5:
            k, pad, stride = 3, rng.choice([0, 1]), rng.choice([1, 2])
            oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
            if oh < 1 or ow < 1:
                return None
            p = (
                f"convolution_param {{ num_output: {c} kernel_size: 3 pad: {pad} "
                f"stride: {stride} group: {c} bias_term: {rng.choice(['true', 'false'])} }}"
            )
            return self.layer("DepthwiseConvolution", [bottom], (n, c, oh, ow), p)
        if c % 2:
            return None
        oh, ow = 2 * (h - 1) + 2, 2 * (w - 1) + 2
        if oh * ow > 400:
            return None
        p = f"convolution_param {{ num_output: {c} kernel_size: 2 stride: 2 group: 2 }}"
        return self.layer("Deconvolution", [bottom], (n, c, oh, ow), p)


def _pooled(size: int, k: int, stride: int, pad: int) -> int:
    """Caffe's pooled size: rounded up, and the last window must start inside the input."""
    out = int(math.ceil((size + 2 * pad - k) / stride)) + 1
    if pad and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def random_net(seed: int, batch: int = 2, dropout: bool = True, wide: bool = False) -> RandomNet:
    """A valid random net of 5 to 14 layers (``dropout``: Dropout may appear; ``wide``: the
    layers of the wider catalogue too, with the core nets of each seed unchanged without)."""
    rng = random.Random(seed)
    b = _Builder(rng, batch)
    target = rng.randint(5, 14)
    producers = {
        "conv": (b.convolution, 0.6),
        "deconv": (b.deconvolution, 0.5),
        "ip": (b.inner_product, 0.5),
    }
    others = {
        "affine": b.affine_chain,
        "act": b.activation,
        "pool": b.pooling,
        "lrn": b.lrn,
        "eltwise": b.eltwise,
        "concat": b.concat,
        "dropout": b.dropout,
        "view": b.view,
        "slice": b.slice,
        "pw": b.pointwise,
        "siblings": b.siblings,
        "wide_pointwise": b.wide_pointwise,
        "wide_normalize": b.wide_normalize,
        "wide_resize": b.wide_resize,
        "wide_reshape": b.wide_reshape,
        "wide_gate": b.wide_gate,
        "wide_conv": b.wide_convolution,
    }
    while len(b.lines) < target:
        four_d = rng.random() < 0.85
        bottom = b.pick(want_4d=four_d)
        is_4d = len(b.shapes[bottom]) == 4
        choices = ["affine", "act", "act", "ip", "eltwise", "concat", "view", "slice", "pw"]
        if dropout:
            choices.append("dropout")
        if is_4d:
            choices += ["conv", "conv", "conv", "deconv", "pool", "pool", "lrn", "siblings"]
        if wide:
            choices += ["wide_pointwise", "wide_normalize", "wide_reshape"]
            if is_4d:
                choices += ["wide_resize", "wide_resize", "wide_gate", "wide_conv"]
        kind = rng.choice(choices)
        if kind in producers:  # a convolution or inner product, maybe with a chain after it
            make, chain_odds = producers[kind]
            top = make(bottom)
            if top is not None and rng.random() < chain_odds:
                b.affine_chain(top)
        else:
            others[kind](bottom)
    dims = " ".join(f"dim: {d}" for d in b.input_shape)
    head = f'name: "random{seed}"\nlayer {{ name: "data" type: "Input" top: "data" '
    head += f"input_param {{ shape {{ {dims} }} }} }}\n"
    return RandomNet(head + "\n".join(b.lines) + "\n", b.input_shape, b.types)


def random_training_net(seed: int) -> str:
    """``random_net(seed, batch=4)`` with a weighted SUMSQ loss on each output,
    every other one with force_backward (data diffs too)."""
    spec = random_net(seed, batch=4)
    parsed = text_format.Parse(spec.text, caffe_pb2.NetParameter())
    outputs = torchcaffe.load(parsed, phase="test").output_names  # the tops no layer reads
    text = spec.text if seed % 2 else "force_backward: true\n" + spec.text
    for i, name in enumerate(outputs):
        text += (
            f'layer {{ name: "loss{i}" type: "Reduction" bottom: "{name}" top: "loss{i}" '
            f"loss_weight: {0.01 * (i + 1)} reduction_param {{ operation: SUMSQ }} }}\n"
        )
    return text
