"""AnnotatedData: SSD's detection data layer (weiliu89/caffe, branch ssd)."""

from __future__ import annotations

import os

import numpy as np
from google.protobuf.message import DecodeError

from ..data import cv, ssd
from ..data.db import DBReader, backend_name, open_db
from ..data.rng import CaffeRNG, for_rank
from ..errors import DataError, TorchCaffeError
from ..formats.binaryproto import read_mean_file
from ..proto import caffe_pb2 as pb
from ..registry import register_layer
from ._data_source import BatchLoader, SourceLayer
from .base import Between

F = np.float32


class AnnotatedLoader(BatchLoader):
    """annotated_data_layer.cpp load_batch: per record distort -> expand -> batch-sample crop
    -> transform (resize, crop, mirror, mean, scale), boxes carried along."""

    def __init__(self, db: DBReader, layer_param: pb.LayerParameter, phase: int) -> None:
        self.db, self.phase = db, phase
        self.tp = tp = layer_param.transform_param
        self.samplers = list(layer_param.annotated_data_param.batch_sampler)
        self.batch_size = int(layer_param.data_param.batch_size)
        self.rng = CaffeRNG()
        self.cursor = db.cursor()
        self.offset, self.rank, self.world_size = 0, 0, 1
        self.scale = F(tp.scale)
        self.crop_h = self.crop_w = int(tp.crop_size)
        if not tp.crop_size:
            self.crop_h, self.crop_w = int(tp.crop_h), int(tp.crop_w)
        self.mean_values = np.asarray(tp.mean_value, F)
        self.mean = None
        if tp.HasField("mean_file"):
            if len(tp.mean_value):
                raise DataError("cannot specify mean_file and mean_value at the same time")
            try:
                m = read_mean_file(tp.mean_file)
            except TorchCaffeError as err:
                raise DataError(f"cannot read mean_file {tp.mean_file!r}: {err}") from None
            self.mean = np.asarray(m, F).reshape(-1, *m.shape[-2:])
        ap = layer_param.annotated_data_param
        self.forced_type = ap.anno_type if ap.HasField("anno_type") else None

    def set_shard(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.rng = for_rank(self.rng, rank)

    def _next(self) -> None:
        self.cursor.next()
        self.offset += 1

    # -- one record -------------------------------------------------------------------------
    def record(self) -> tuple[pb.AnnotatedDatum, np.ndarray]:
        anno = pb.AnnotatedDatum()
        key = self.cursor.key.decode("utf-8", "replace")
        try:
            anno.ParseFromString(self.cursor.value)
        except (DecodeError, ValueError, RuntimeError) as err:
            raise DataError(
                f"record {key!r} is not a valid serialized AnnotatedDatum ({err})",
                path=self.db.path,
            ) from None
        return anno, self.decode(anno.datum, key)

    def decode(self, datum: pb.Datum, key: str = "?") -> np.ndarray:
        """The datum as an HxWxC uint8 image (force_color/force_gray for encoded ones)."""
        where = f"{self.db.path} (key {key!r})"
        if datum.encoded:
            if self.tp.force_color or self.tp.force_gray:
                flag = cv.IMREAD_COLOR if self.tp.force_color else cv.IMREAD_GRAYSCALE
            else:
                flag = cv.IMREAD_UNCHANGED
            img = cv.decode(datum.data, flag, source=where)
            return img if img.ndim == 3 else img[:, :, None]
        c, h, w = datum.channels, datum.height, datum.width
        if not datum.data or len(datum.data) != c * h * w:
            raise DataError(
                "AnnotatedData needs uint8 pixel datums (data of channels*height*width bytes)",
                path=where,
                expected=c * h * w,
                got=len(datum.data),
            )
        return np.frombuffer(datum.data, np.uint8).reshape(c, h, w).transpose(1, 2, 0)

    def _reencode(self, img: np.ndarray, encoded: bool) -> np.ndarray:
        """The fork stores every intermediate of an encoded datum as JPEG (EncodeCVMatToDatum
        "jpg") and decodes it again: the same loss here."""
        if not encoded:
            return img
        buf = cv.encode(img[:, :, 0] if img.shape[2] == 1 else img, "jpg", source=self.db.path)
        return self.decode(pb.Datum(data=buf, encoded=True))

    def augment(self, anno: pb.AnnotatedDatum, img: np.ndarray):
        tp, enc = self.tp, anno.datum.encoded
        groups = ssd.groups_of(anno)
        emit = tp.emit_constraint if tp.HasField("emit_constraint") else None
        if tp.HasField("distort_param") and enc:  # the fork distorts encoded datums only
            squeeze = img.shape[2] == 1
            out = ssd.distort(self.rng, img[:, :, 0] if squeeze else img, tp.distort_param)
            img = self._reencode(out[:, :, None] if out.ndim == 2 else out, enc)
        if tp.HasField("expand_param"):
            ep = tp.expand_param
            if not ssd.uniform(self.rng, 0, 1) > ep.prob and abs(ep.max_expand_ratio - 1) >= 1e-2:
                ratio = ssd.uniform(self.rng, 1, ep.max_expand_ratio)
                fill = self._fill(img.shape[2])
                img, box = ssd.expand_image(self.rng, img, ratio, fill)
                groups = ssd.transform_groups(groups, box, emit=emit)
                img = self._reencode(img, enc)
        if self.samplers:
            boxes = ssd.batch_samples(self.rng, groups, self.samplers)
            if boxes:
                box = boxes[self.rng.draw() % len(boxes)]
                img = ssd.crop_image(img, box)
                groups = ssd.transform_groups(groups, ssd.clip(box), emit=emit)
                img = self._reencode(img, enc)
        return img, groups

    def _fill(self, channels: int):
        if self.mean is not None:
            raise DataError("expand_param with mean_file is not supported; use mean_value")
        if self.mean_values.size:
            values = np.broadcast_to(self.mean_values, (channels,))
            return np.asarray([int(v) & 0xFF for v in values], np.uint8)  # static_cast<char>
        return np.zeros(channels, np.uint8)

    def out_shape(self, img: np.ndarray) -> tuple[int, int, int]:
        h, w, c = img.shape
        if self.tp.HasField("resize_param"):
            w, h = ssd.new_size(self.tp.resize_param, w, h)
        if h < self.crop_h or w < self.crop_w:
            raise DataError("crop larger than the image", path=self.db.path, got=(h, w))
        return (c, self.crop_h or h, self.crop_w or w)

    def transform(
        self, img: np.ndarray, out: np.ndarray, encoded: bool = True
    ) -> tuple[ssd.Box, bool]:
        """SSD's Transform(cv::Mat, blob, crop_bbox, do_mirror) for encoded records, its
        Transform(Datum, ...) for raw ones; they differ in where a mirrored image reads the
        mean_file: raw records at the source pixel (the mean flips with the image), encoded
        ones at the output pixel (``mean_index`` uses the mirrored ``w_idx``)."""
        tp = self.tp
        do_mirror = bool(tp.mirror) and self.rng.rand(2) == 1
        if tp.HasField("resize_param"):
            img = ssd.apply_resize(self.rng, img, tp.resize_param)
            if img.ndim == 2:
                img = img[:, :, None]
        ih, iw = img.shape[:2]
        c, oh, ow = out.shape
        h_off = w_off = 0
        if self.crop_h and self.crop_w:
            if self.phase == pb.TRAIN:
                h_off, w_off = (
                    self.rng.rand(ih - self.crop_h + 1),
                    self.rng.rand(iw - self.crop_w + 1),
                )
            else:
                h_off, w_off = (ih - self.crop_h) // 2, (iw - self.crop_w) // 2
        crop_box = ssd.Box(
            F(w_off) / F(iw), F(h_off) / F(ih), F(w_off + ow) / F(iw), F(h_off + oh) / F(ih)
        )
        patch = img[h_off : h_off + oh, w_off : w_off + ow].transpose(2, 0, 1)
        if patch.shape != out.shape:
            raise DataError(
                "record shape differs from the batch's first record",
                path=self.db.path,
                expected=out.shape,
                got=patch.shape,
            )
        if do_mirror:
            patch = patch[:, :, ::-1]
        np.copyto(out, patch, casting="unsafe")
        if self.mean is not None:
            if self.mean.shape != out.shape:
                raise DataError(
                    "mean_file shape differs from the transformed image",
                    path=self.db.path,
                    expected=out.shape,
                    got=self.mean.shape,
                )
            out -= self.mean[:, :, ::-1] if do_mirror and not encoded else self.mean
        elif self.mean_values.size:
            if self.mean_values.size not in (1, c):
                raise DataError(
                    "specify either 1 mean_value or as many as channels",
                    expected=f"1 or {c}",
                    got=self.mean_values.size,
                )
            out -= np.broadcast_to(self.mean_values, (c,)).reshape(c, 1, 1)
        out *= self.scale
        return crop_box, do_mirror

    # -- the batch --------------------------------------------------------------------------
    def next_batch(self) -> list[np.ndarray]:
        data = None
        labels: list[list[float]] = []
        plain = np.empty(self.batch_size, F)
        rich = self.forced_type is not None
        for item in range(self.batch_size):
            while self.offset % self.world_size != self.rank and self.phase != pb.TEST:
                self._next()
            anno, img = self.record()
            rich = rich or anno.HasField("type")
            img, groups = self.augment(anno, img)
            if data is None:
                data = np.empty((self.batch_size, *self.out_shape(img)), F)
            crop_box, mirrored = self.transform(img, data[item], anno.datum.encoded)
            hw = img.shape[:2]
            resize = self.tp.resize_param if self.tp.HasField("resize_param") else None
            emit = self.tp.emit_constraint if self.tp.HasField("emit_constraint") else None
            groups = ssd.transform_groups(
                groups, crop_box, mirror=mirrored, emit=emit, resize=resize, image_hw=hw
            )
            for label, annos in groups:
                for instance, b in annos:
                    labels.append(
                        [item, label, instance, b.xmin, b.ymin, b.xmax, b.ymax, float(b.difficult)]
                    )
            plain[item] = anno.datum.label
            self._next()
        assert data is not None
        if not rich:
            return [data, plain]
        rows = np.asarray(labels, F).reshape(-1, 8) if labels else np.full((1, 8), -1, F)
        return [data, rows[None, None]]


@register_layer("AnnotatedData", fork="SSD")
class AnnotatedDataLayer(SourceLayer):
    """SSD's ``AnnotatedData``: AnnotatedDatum records from LMDB/LevelDB (``data_param``),
    ``annotated_data_param`` (batch_sampler, anno_type, label_map_file) and SSD's
    ``transform_param`` (distort_param, expand_param, resize_param, emit_constraint, crop_h /
    crop_w, mirror, mean, scale).

    Per record: photometric distortion (encoded datums, as the fork), zoom-out expansion,
    one crop drawn among the batch samplers' boxes, then resize, crop, mirror, mean and scale.
    Tops: data (batch, C, H, W); label (1, 1, boxes, 8) rows ``[item, group_label,
    instance_id, xmin, ymin, xmax, ymax, difficult]`` (one row of -1 when no box survives),
    or (batch,) datum labels for records without an annotation type.
    """

    tops = Between(1, 2)
    param_field = "annotated_data_param"
    restrictions = (
        "random draws (sampling, distortion, expansion, interp_mode, mirror, crop) come from "
        "one mt19937 seeded from torch's RNG, not the fork's caffe_rng stream; noise_param is "
        "refused; expand_param with a mean_file is refused; label_map_file is not read (the "
        "fork does not read it either)"
    )

    def __init__(self, layer_param, bottom_shapes):
        super().__init__(layer_param, bottom_shapes)
        dp, tp = layer_param.data_param, layer_param.transform_param
        self._check_batch_size(dp.batch_size)
        if tp.HasField("noise_param"):
            raise self.error(
                "transform_param.noise_param is not supported",
                expected="no noise_param",
                got="noise_param",
                cls=TorchCaffeError,
            )
        if tp.force_color and tp.force_gray:
            raise self.error("cannot set both force_color and force_gray")
        backend = backend_name(dp.backend)
        try:
            db = open_db(dp.source, backend)
        except TorchCaffeError as err:
            raise self.error(
                f"cannot open the {backend} database {dp.source!r}: {err.what}",
                hint=err.hint or f"opened relative to the working directory {os.getcwd()}",
                cls=type(err),
            ) from None
        try:
            loader = AnnotatedLoader(db, layer_param, self.phase)
            anno, img = loader.record()
            shape = loader.out_shape(img)
        except TorchCaffeError as err:
            raise err.located(layer=self.name, layer_type=self.caffe_type) from None
        self.loader = loader
        self.prefetch_depth = int(dp.prefetch) if dp.prefetch > 0 else 1
        b = int(dp.batch_size)
        rich = anno.HasField("type") or loader.forced_type is not None
        boxes = sum(len(g.annotation) for g in anno.annotation_group)
        label_shape = (1, 1, max(boxes, 1), 8) if rich else (b,)
        tops: list[tuple[int, ...]] = [(b, *shape), label_shape]
        self._top_shapes = tops[: self.num_tops]

    def close(self) -> None:
        super().close()
        if isinstance(self.loader, AnnotatedLoader):
            self.loader.db.close()
