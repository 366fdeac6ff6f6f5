"""SSD's data augmentation (weiliu89/caffe, branch ssd): boxes, batch samplers, photometric
distortion, zoom-out expansion, resize policies, and the annotation bookkeeping of its
DataTransformer. Box arithmetic is float32, as the fork's ``float`` fields.

Images are HxWxC uint8 arrays in OpenCV order. Random draws come from one ``CaffeRNG``:
``uniform(a, b)`` stands for caffe_rng_uniform and ``rng.draw()`` for caffe_rng_rand, so the
distributions are the fork's while the stream is not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import DataError
from ..proto import caffe_pb2 as pb
from . import cv
from .rng import CaffeRNG

F = np.float32
Num = Any  # a float32 scalar (np.float32) where the fork computes in float, or a Python float


@dataclass(frozen=True)
class Box:
    """NormalizedBBox: corners in [0, 1] image units; ``size`` as the fork caches it."""

    xmin: Num
    ymin: Num
    xmax: Num
    ymax: Num
    difficult: bool = False
    size: Num | None = None

    @classmethod
    def of(cls, b: pb.NormalizedBBox) -> Box:
        return cls(
            F(b.xmin),
            F(b.ymin),
            F(b.xmax),
            F(b.ymax),
            bool(b.difficult),
            F(b.size) if b.HasField("size") else None,
        )


def box_size(b: Box, normalized: bool = True) -> Num:
    if b.xmax < b.xmin or b.ymax < b.ymin:
        return F(0)
    if b.size is not None:
        return b.size
    w, h = F(b.xmax - b.xmin), F(b.ymax - b.ymin)
    return F(w * h) if normalized else F((w + 1) * (h + 1))


def clip(b: Box) -> Box:
    def c(v: Num) -> Num:
        return F(max(min(v, F(1)), F(0)))

    out = Box(c(b.xmin), c(b.ymin), c(b.xmax), c(b.ymax), b.difficult)
    return replace(out, size=box_size(out))


def intersect(a: Box, b: Box) -> Box:
    if b.xmin > a.xmax or b.xmax < a.xmin or b.ymin > a.ymax or b.ymax < a.ymin:
        return Box(F(0), F(0), F(0), F(0))
    return Box(max(a.xmin, b.xmin), max(a.ymin, b.ymin), min(a.xmax, b.xmax), min(a.ymax, b.ymax))


def jaccard(a: Box, b: Box) -> Num:
    i = intersect(a, b)
    w, h = F(i.xmax - i.xmin), F(i.ymax - i.ymin)
    if w > 0 and h > 0:
        inter = F(w * h)
        return F(inter / F(box_size(a) + box_size(b) - inter))
    return F(0)


def coverage(a: Box, b: Box) -> Num:
    """BBoxCoverage(a, b): the fraction of ``a`` inside ``b``."""
    inter = box_size(intersect(a, b))
    return F(inter / box_size(a)) if inter > 0 else F(0)


def locate(src: Box, b: Box) -> Box:
    w, h = F(src.xmax - src.xmin), F(src.ymax - src.ymin)
    return Box(
        F(src.xmin + b.xmin * w),
        F(src.ymin + b.ymin * h),
        F(src.xmin + b.xmax * w),
        F(src.ymin + b.ymax * h),
        b.difficult,
    )


def project(src: Box, b: Box) -> Box | None:
    if b.xmin >= src.xmax or b.xmax <= src.xmin or b.ymin >= src.ymax or b.ymax <= src.ymin:
        return None
    w, h = F(src.xmax - src.xmin), F(src.ymax - src.ymin)
    out = clip(
        Box(
            F((b.xmin - src.xmin) / w),
            F((b.ymin - src.ymin) / h),
            F((b.xmax - src.xmin) / w),
            F((b.ymax - src.ymin) / h),
            b.difficult,
        )
    )
    return out if box_size(out) > 0 else None


def meets_emit_constraint(src: Box, b: Box, c: pb.EmitConstraint) -> bool:
    if c.emit_type == pb.EmitConstraint.CENTER:
        x, y = F((b.xmin + b.xmax) / 2), F((b.ymin + b.ymax) / 2)
        return bool(src.xmin <= x <= src.xmax and src.ymin <= y <= src.ymax)
    return bool(coverage(b, src) > F(c.emit_overlap))


# -- annotations --------------------------------------------------------------------------
Groups = list[tuple[int, list[tuple[int, Box]]]]  # (group_label, [(instance_id, box)])


def groups_of(anno: pb.AnnotatedDatum) -> Groups:
    return [
        (g.group_label, [(a.instance_id, Box.of(a.bbox)) for a in g.annotation])
        for g in anno.annotation_group
    ]


def transform_groups(
    groups: Groups,
    crop: Box,
    *,
    mirror: bool = False,
    emit: pb.EmitConstraint | None = None,
    resize: pb.ResizeParameter | None = None,
    image_hw: tuple[int, int] = (0, 0),
) -> Groups:
    """TransformAnnotation: resize policy, emit constraint, projection into ``crop``,
    mirror, extrapolation; groups left empty are dropped."""
    out: Groups = []
    for label, annos in groups:
        kept = []
        for instance, box in annos:
            if resize is not None:
                box = resized_box(resize, image_hw[1], image_hw[0], box)
            if emit is not None and not meets_emit_constraint(crop, box, emit):
                continue
            proj = project(crop, box)
            if proj is None:
                continue
            if mirror:
                proj = replace(proj, xmin=F(1 - proj.xmax), xmax=F(1 - proj.xmin))
            if resize is not None:
                proj = extrapolate(resize, image_hw[0], image_hw[1], crop, proj)
            kept.append((instance, proj))
        if kept:
            out.append((label, kept))
    return out


# -- batch samplers -----------------------------------------------------------------------
def uniform(rng: CaffeRNG, low: Num, high: Num) -> Num:
    return F(low + (F(high) - F(low)) * F(rng.draw() / 4294967296.0))


def sample_box(rng: CaffeRNG, s: pb.Sampler) -> Box:
    if not (0 < s.min_scale <= s.max_scale <= 1):
        raise DataError(
            "sampler needs 0 < min_scale <= max_scale <= 1", got=(s.min_scale, s.max_scale)
        )
    if not (0 < s.min_aspect_ratio <= s.max_aspect_ratio):
        raise DataError(
            "sampler needs 0 < min_aspect_ratio <= max_aspect_ratio",
            got=(s.min_aspect_ratio, s.max_aspect_ratio),
        )
    scale = uniform(rng, s.min_scale, s.max_scale)
    aspect = uniform(rng, s.min_aspect_ratio, s.max_aspect_ratio)
    aspect = F(max(aspect, F(scale**2)))
    aspect = F(min(aspect, F(1 / scale**2)))
    w, h = F(scale * F(math.sqrt(aspect))), F(scale / F(math.sqrt(aspect)))
    w_off = uniform(rng, 0, F(1 - w))
    h_off = uniform(rng, 0, F(1 - h))
    return Box(w_off, h_off, F(w_off + w), F(h_off + h))


def satisfies(sampled: Box, objects: list[Box], c: pb.SampleConstraint) -> bool:
    """SatisfySampleConstraint: some object meets every bound given."""
    has_j = c.HasField("min_jaccard_overlap") or c.HasField("max_jaccard_overlap")
    has_s = c.HasField("min_sample_coverage") or c.HasField("max_sample_coverage")
    has_o = c.HasField("min_object_coverage") or c.HasField("max_object_coverage")
    if not (has_j or has_s or has_o):
        return True
    found = False
    for obj in objects:
        checks = []
        if has_j:
            checks.append((jaccard(sampled, obj), "jaccard_overlap"))
        if has_s:
            checks.append((coverage(sampled, obj), "sample_coverage"))
        if has_o:
            checks.append((coverage(obj, sampled), "object_coverage"))
        ok = True
        for value, name in checks:
            if c.HasField(f"min_{name}") and value < F(getattr(c, f"min_{name}")):
                ok = False
                break
            if c.HasField(f"max_{name}") and value > F(getattr(c, f"max_{name}")):
                ok = False
                break
            found = True
        if ok and found:
            return True
    return found


def batch_samples(rng: CaffeRNG, groups: Groups, samplers) -> list[Box]:
    """GenerateBatchSamples over the unit box."""
    objects = [box for _, annos in groups for _, box in annos]
    unit = Box(F(0), F(0), F(1), F(1))
    out: list[Box] = []
    for bs in samplers:
        if not bs.use_original_image:
            continue
        found = 0
        for _ in range(bs.max_trials):
            if bs.HasField("max_sample") and found >= bs.max_sample:
                break
            box = locate(unit, sample_box(rng, bs.sampler))
            if satisfies(box, objects, bs.sample_constraint):
                found += 1
                out.append(box)
    return out


# -- image operations ---------------------------------------------------------------------
def crop_image(img: np.ndarray, box: Box) -> np.ndarray:
    """CropImage: the clipped box scaled to pixels, truncated to int."""
    c = clip(box)
    h, w = img.shape[:2]
    x0, y0 = int(F(c.xmin * w)), int(F(c.ymin * h))
    cw, ch = int(F(F(c.xmax * w) - F(c.xmin * w))), int(F(F(c.ymax * h) - F(c.ymin * h)))
    return img[y0 : y0 + ch, x0 : x0 + cw].copy()


def expand_image(rng: CaffeRNG, img: np.ndarray, ratio: Num, fill) -> tuple[np.ndarray, Box]:
    """ExpandImage: the image placed at a random integer offset on a ratio-times larger
    canvas filled with the mean; returns the canvas and the image's box in canvas units."""
    h, w = img.shape[:2]
    eh, ew = int(F(h * ratio)), int(F(w * ratio))
    h_off = math.floor(uniform(rng, 0, F(eh - h)))
    w_off = math.floor(uniform(rng, 0, F(ew - w)))
    canvas = np.empty((eh, ew) + img.shape[2:], np.uint8)
    canvas[...] = fill
    canvas[h_off : h_off + h, w_off : w_off + w] = img
    box = Box(F(-w_off / w), F(-h_off / h), F((ew - w_off) / w), F((eh - h_off) / h))
    return canvas, box


def _convert(img: np.ndarray, alpha: Num, beta: Num) -> np.ndarray:
    """cv::Mat::convertTo(-1, alpha, beta): saturate_cast<uchar>(v * alpha + beta)."""
    v = img.astype(F) * F(alpha) + F(beta)
    return np.clip(np.rint(v), 0, 255).astype(np.uint8)


def distort(rng: CaffeRNG, img: np.ndarray, p: pb.DistortionParameter) -> np.ndarray:
    """ApplyDistort: brightness, contrast (before or after saturation/hue, at random),
    saturation, hue in HSV, random channel order."""
    m = cv.cv2()

    def brightness(x):
        if uniform(rng, 0, 1) < p.brightness_prob:
            d = uniform(rng, -p.brightness_delta, p.brightness_delta)
            return _convert(x, 1, d) if abs(d) > 0 else x
        return x

    def contrast(x):
        if uniform(rng, 0, 1) < p.contrast_prob:
            d = uniform(rng, p.contrast_lower, p.contrast_upper)
            return _convert(x, d, 0) if abs(d - 1) > 1e-3 else x
        return x

    def hsv(x, channel, lo, hi, prob, additive):
        if uniform(rng, 0, 1) < prob:
            d = uniform(rng, lo, hi)
            if additive and not abs(d) > 0:
                return x
            hsv_img = m.cvtColor(x, m.COLOR_BGR2HSV)
            plane = hsv_img[:, :, channel]
            hsv_img[:, :, channel] = _convert(plane, 1, d) if additive else _convert(plane, d, 0)
            return m.cvtColor(hsv_img, m.COLOR_HSV2BGR)
        return x

    def saturation(x):
        return hsv(x, 1, p.saturation_lower, p.saturation_upper, p.saturation_prob, False)

    def hue(x):
        return hsv(x, 0, -p.hue_delta, p.hue_delta, p.hue_prob, True)

    def order(x):
        if uniform(rng, 0, 1) < p.random_order_prob:
            if x.ndim != 3 or x.shape[2] != 3:
                raise DataError("random channel order needs a 3-channel image")
            perm = [0, 1, 2]
            rng.shuffle(perm)
            return np.ascontiguousarray(x[:, :, perm])
        return x

    steps = (
        (brightness, contrast, saturation, hue, order)
        if uniform(rng, 0, 1) > 0.5
        else (brightness, saturation, hue, contrast, order)
    )
    for step in steps:
        img = step(img)
    return img


_INTERP = {
    pb.ResizeParameter.LINEAR: "INTER_LINEAR",
    pb.ResizeParameter.AREA: "INTER_AREA",
    pb.ResizeParameter.NEAREST: "INTER_NEAREST",
    pb.ResizeParameter.CUBIC: "INTER_CUBIC",
    pb.ResizeParameter.LANCZOS4: "INTER_LANCZOS4",
}
_BORDER = {
    pb.ResizeParameter.CONSTANT: "BORDER_CONSTANT",
    pb.ResizeParameter.MIRRORED: "BORDER_REFLECT101",
    pb.ResizeParameter.REPEAT_NEAREST: "BORDER_REPLICATE",
}


def new_size(p: pb.ResizeParameter, w: int, h: int) -> tuple[int, int]:
    """InferNewSize -> (width, height)."""
    nw, nh = int(p.width), int(p.height)
    if p.resize_mode == pb.ResizeParameter.FIT_SMALL_SIZE:
        aspect, new_aspect = F(F(w) / F(h)), F(F(nw) / F(nh))
        if aspect < new_aspect:
            nh = int(F(nw / aspect))
        else:
            nw = int(F(aspect * nh))
    return nw, nh


def apply_resize(rng: CaffeRNG, img: np.ndarray, p: pb.ResizeParameter) -> np.ndarray:
    m = cv.cv2()
    interp = m.INTER_LINEAR
    if len(p.interp_mode):
        cum = np.cumsum([F(1 / len(p.interp_mode))] * len(p.interp_mode), dtype=F)
        v = uniform(rng, 0, cum[-1])
        interp = getattr(m, _INTERP[p.interp_mode[int(np.searchsorted(cum, v))]])
    nw, nh = int(p.width), int(p.height)
    h, w = img.shape[:2]
    aspect, new_aspect = F(F(w) / F(h)), F(F(nw) / F(nh))
    if p.resize_mode == pb.ResizeParameter.WARP:
        return m.resize(img, (nw, nh), interpolation=interp)
    if p.resize_mode == pb.ResizeParameter.FIT_SMALL_SIZE:
        if aspect < new_aspect:
            return m.resize(img, (nw, math.floor(F(nw) / aspect)), interpolation=interp)
        return m.resize(img, (math.floor(aspect * F(nh)), nh), interpolation=interp)
    pad = list(p.pad_value) or [0.0]
    channels = 1 if img.ndim == 2 else img.shape[2]
    if len(pad) not in (1, channels):
        raise DataError("specify either 1 pad_value or one per channel", got=len(pad))
    value = (pad * channels)[:channels] if len(pad) == 1 else pad
    border = getattr(m, _BORDER[p.pad_mode])
    if aspect > new_aspect:
        rh = math.floor(F(nw) / aspect)
        out = m.resize(img, (nw, rh), interpolation=interp)
        top = math.floor((nh - rh) / 2.0)
        return m.copyMakeBorder(out, top, nh - rh - top, 0, 0, border, value=value)
    rw = math.floor(aspect * F(nh))
    out = m.resize(img, (rw, nh), interpolation=interp)
    left = math.floor((nw - rw) / 2.0)
    return m.copyMakeBorder(out, 0, 0, left, nw - rw - left, border, value=value)


def resized_box(p: pb.ResizeParameter, old_w: int, old_h: int, b: Box) -> Box:
    """UpdateBBoxByResizePolicy."""
    nh, nw = F(p.height), F(p.width)
    aspect, new_aspect = F(F(old_w) / F(old_h)), F(nw / nh)
    x0, y0, x1, y1 = F(b.xmin * old_w), F(b.ymin * old_h), F(b.xmax * old_w), F(b.ymax * old_h)
    mode = p.resize_mode
    if mode == pb.ResizeParameter.FIT_SMALL_SIZE:
        if aspect < new_aspect:
            nh = F(nw / aspect)
        else:
            nw = F(aspect * nh)
    if mode == pb.ResizeParameter.FIT_LARGE_SIZE_AND_PAD:
        if aspect > new_aspect:
            pad = F((nh - nw / aspect) / 2)
            x0, x1 = max(F(0), F(x0 * nw / old_w)), min(nw, F(x1 * nw / old_w))
            y0 = F(pad + max(F(0), F(y0 * (nh - 2 * pad) / old_h)))
            y1 = F(pad + min(nh, F(y1 * (nh - 2 * pad) / old_h)))
        else:
            pad = F((nw - aspect * nh) / 2)
            x0 = F(pad + max(F(0), F(x0 * (nw - 2 * pad) / old_w)))
            x1 = F(pad + min(nw, F(x1 * (nw - 2 * pad) / old_w)))
            y0, y1 = max(F(0), F(y0 * nh / old_h)), min(nh, F(y1 * nh / old_h))
    else:
        x0, x1 = max(F(0), F(x0 * nw / old_w)), min(nw, F(x1 * nw / old_w))
        y0, y1 = max(F(0), F(y0 * nh / old_h)), min(nh, F(y1 * nh / old_h))
    return Box(F(x0 / nw), F(y0 / nh), F(x1 / nw), F(y1 / nh), b.difficult, b.size)


def extrapolate(p: pb.ResizeParameter, h: int, w: int, crop: Box, b: Box) -> Box:
    """ExtrapolateBBox (FIT_SMALL_SIZE with height_scale/width_scale only)."""
    if not (
        p.height_scale > 0
        and p.width_scale > 0
        and p.resize_mode == pb.ResizeParameter.FIT_SMALL_SIZE
    ):
        return b
    aspect = F(F(w) / F(h))
    rh, rw = F(p.height), F(p.width)
    if aspect < F(rw / rh):
        rh = F(rw / aspect)
    else:
        rw = F(rh * aspect)
    ch, cw = F(rh * (crop.ymax - crop.ymin)), F(rw * (crop.xmax - crop.xmin))
    return replace(
        b,
        xmin=F(b.xmin * cw / p.width_scale),
        xmax=F(b.xmax * cw / p.width_scale),
        ymin=F(b.ymin * ch / p.height_scale),
        ymax=F(b.ymax * ch / p.height_scale),
    )
