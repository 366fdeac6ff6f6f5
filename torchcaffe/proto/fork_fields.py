"""Which fields of ``proto/caffe.proto`` are not BVLC Caffe's, and where forks put them.

The schema keeps every BVLC field exactly. Fork fields sit at their fork's own number when that
number is free; otherwise they are *relocated* (to 10000 + the fork's number, or onto the one
number we chose for a field several forks define under the same name). A text prototxt from a
fork parses either way (text format goes by name), but a *binary* file written by that fork
carries the fork's number, which our schema reads as an unknown field or as a different field.
These tables are reference data for reading such a binary file by hand: nothing maps binary
dialects automatically yet (text prototxts need no mapping beyond ``ceil_mode``, which
``formats.upgrade`` handles). ``tests/proto/test_fork_fields.py`` checks them against the schema.

Coverage: every field of the schema that BVLC lacks is listed in ``RELOCATED_FIELDS`` (our number
differs from a fork's), in ``FORK_FIELDS`` (at that fork's own number), or belongs to a message in
``FORK_MESSAGES`` (a message no BVLC release has; its fields are at the numbers of the fork named
there unless listed in the two field tables). A field has one record per fork that defines it,
so one field can be in both field tables (e.g. ``bn_param``: PSPNet's number, SegNet's moved).

This module is pure data; it imports nothing from torchcaffe.
"""

from __future__ import annotations

from dataclasses import dataclass

# Fork name -> where its schema was read from.
FORKS: dict[str, str] = {
    "SSD": "weiliu89/caffe, branch ssd",
    "brocolli": "brocolli-caffe 9.0.2 (PyPI sdist; SSD + Faster R-CNN + conversion layers)",
    "frcnn": "rbgirshick/caffe-fast-rcnn, branch faster-rcnn (py-faster-rcnn)",
    "R-FCN": "daijifeng001/caffe-rfcn",
    "PSPNet": "hszhao/PSPNet (DeepLab-v2 lineage; DeepLab-v2 uses the same Interp/BN numbers)",
    "SegNet": "alexgkendall/caffe-segnet, branch segnet-cleaned",
    "ShuffleNet": "farmingyard/ShuffleNet (ShuffleChannel layer)",
    "ENet": "TimoSaemann/caffe-enet (SegNet lineage)",
    "caffe-priv": "soeaver/py-RFCN-priv, caffe-priv (target of soeaver/caffe-model prototxts)",
}


@dataclass(frozen=True)
class ForkField:
    """A non-BVLC field kept at its fork's own number."""

    message: str  # full name, e.g. "caffe.LayerParameter"
    field: str
    number: int
    fork: str


@dataclass(frozen=True)
class RelocatedField:
    """A fork field whose number in our schema differs from the fork's.

    ``clashes_with`` is the full name of the field of our schema that holds ``fork_number``
    (usually a BVLC field). When it names this same field, the clash is by name: several forks
    define the field at different numbers and the schema keeps it once, at ``number``.
    """

    message: str
    field: str
    number: int  # our number
    fork: str
    fork_number: int
    clashes_with: str


@dataclass(frozen=True)
class ForkMessage:
    """A message no BVLC release has; its fields follow ``fork`` unless listed elsewhere."""

    message: str
    fork: str
    fork_name: str = ""  # the fork's own message name, when we renamed it


_L = "caffe.LayerParameter"
_SP = "caffe.SolverParameter"
_POOL = "caffe.PoolingParameter"
_LOSS = "caffe.LossParameter"
_DROP = "caffe.DropoutParameter"
_DET = "caffe.DetectionOutputParameter"
_BN = "caffe.BNParameter"
_UP = "caffe.UpsampleParameter"
_R = RelocatedField

RELOCATED_FIELDS: tuple[RelocatedField, ...] = (
    # message, field, our number, fork, fork's number, field of ours holding that number/name
    _R(_SP, "eval_type", 10041, "SSD", 41, f"{_SP}.layer_wise_reduce"),
    _R(_SP, "ap_version", 10042, "SSD", 42, f"{_SP}.weights"),
    _R(_SP, "eval_type", 10041, "brocolli", 41, f"{_SP}.layer_wise_reduce"),
    _R(_SP, "ap_version", 10042, "brocolli", 42, f"{_SP}.weights"),
    _R(_L, "interp_param", 10143, "PSPNet", 143, f"{_L}.input_param"),
    _R(_L, "interp_param", 10143, "caffe-priv", 20001, f"{_L}.interp_param"),
    _R(_L, "dense_image_data_param", 10138, "SegNet", 138, f"{_L}.tile_param"),
    _R(_L, "upsample_param", 500, "SegNet", 137, f"{_L}.embed_param"),
    _R(_L, "bn_param", 152, "SegNet", 45, f"{_L}.bn_param"),
    _R(_L, "dense_image_data_param", 10138, "ENet", 46, f"{_L}.dense_image_data_param"),
    _R(_L, "upsample_param", 500, "ENet", 147, f"{_L}.swish_param"),
    _R(_L, "bn_param", 152, "ENet", 45, f"{_L}.bn_param"),
    _R(_L, "bn_param", 152, "brocolli", 1111, f"{_L}.bn_param"),
    _R(_L, "psroi_pooling_param", 149, "R-FCN", 10001, f"{_L}.psroi_pooling_param"),
    _R(_L, "psroi_pooling_param", 149, "caffe-priv", 148, f"{_L}.clip_param"),
    _R(_L, "roi_pooling_param", 8266711, "caffe-priv", 147, f"{_L}.swish_param"),
    _R(_L, "smooth_l1_loss_param", 8266712, "caffe-priv", 150, f"{_L}.smooth_l1_loss_param"),
    _R(_POOL, "ceil_mode", 10013, "brocolli", 13, f"{_POOL}.round_mode"),
    _R(_POOL, "ceil_mode", 10013, "caffe-priv", 13, f"{_POOL}.round_mode"),
    _R(_LOSS, "weight_by_label_freqs", 10003, "SegNet", 3, f"{_LOSS}.normalization"),
    _R(_DROP, "sample_weights_test", 10002, "SegNet", 2, f"{_DROP}.scale_train"),
    _R(_DET, "thresholds", 10012, "brocolli", 12, f"{_DET}.save_file"),
    _R(_DET, "save_file", 12, "brocolli", 13, f"{_DET}.save_file"),
    _R(_BN, "scale_filler", 10001, "SegNet", 1, f"{_BN}.slope_filler"),
    _R(_BN, "shift_filler", 10002, "SegNet", 2, f"{_BN}.bias_filler"),
    _R(_BN, "bn_mode", 10003, "SegNet", 3, f"{_BN}.momentum"),
    _R(_UP, "scale_h", 10002, "SegNet", 2, f"{_UP}.dims_num"),
)

FORK_FIELDS: tuple[ForkField, ...] = (
    # SSD, in BVLC messages.
    ForkField("caffe.SolverParameter", "show_per_class_result", 44, "SSD"),
    ForkField("caffe.SolverParameter", "plateau_winsize", 43, "SSD"),
    ForkField("caffe.SolverState", "minimum_loss", 5, "SSD"),
    ForkField("caffe.SolverState", "iter_last_event", 6, "SSD"),
    ForkField(_L, "annotated_data_param", 200, "SSD"),
    ForkField(_L, "multibox_loss_param", 201, "SSD"),
    ForkField(_L, "permute_param", 202, "SSD"),
    ForkField(_L, "prior_box_param", 203, "SSD"),
    ForkField(_L, "detection_output_param", 204, "SSD"),
    ForkField(_L, "detection_evaluate_param", 205, "SSD"),
    ForkField(_L, "norm_param", 206, "SSD"),
    ForkField(_L, "video_data_param", 207, "SSD"),
    ForkField("caffe.TransformationParameter", "resize_param", 8, "SSD"),
    ForkField("caffe.TransformationParameter", "noise_param", 9, "SSD"),
    ForkField("caffe.TransformationParameter", "emit_constraint", 10, "SSD"),
    ForkField("caffe.TransformationParameter", "crop_h", 11, "SSD"),
    ForkField("caffe.TransformationParameter", "crop_w", 12, "SSD"),
    ForkField("caffe.TransformationParameter", "distort_param", 13, "SSD"),
    ForkField("caffe.TransformationParameter", "expand_param", 14, "SSD"),
    # brocolli carries SSD's params at SSD's numbers; it names the transform resize field
    # old_resize_param (same number 8, compatible message) and lacks distort/expand_param.
    ForkField(_L, "annotated_data_param", 200, "brocolli"),
    ForkField(_L, "multibox_loss_param", 201, "brocolli"),
    ForkField(_L, "permute_param", 202, "brocolli"),
    ForkField(_L, "prior_box_param", 203, "brocolli"),
    ForkField(_L, "detection_output_param", 204, "brocolli"),
    ForkField(_L, "detection_evaluate_param", 205, "brocolli"),
    ForkField(_L, "norm_param", 206, "brocolli"),
    ForkField(_L, "video_data_param", 207, "brocolli"),
    ForkField("caffe.TransformationParameter", "resize_param", 8, "brocolli"),  # old_resize_param
    ForkField("caffe.TransformationParameter", "noise_param", 9, "brocolli"),
    ForkField("caffe.TransformationParameter", "emit_constraint", 10, "brocolli"),
    ForkField("caffe.TransformationParameter", "crop_h", 11, "brocolli"),
    ForkField("caffe.TransformationParameter", "crop_w", 12, "brocolli"),
    # brocolli's own layers.
    ForkField(_L, "psroi_pooling_param", 149, "brocolli"),
    ForkField(_L, "inception_param", 250, "brocolli"),
    ForkField(_L, "resize_param", 251, "brocolli"),
    ForkField(_L, "upsample_param", 500, "brocolli"),
    ForkField(_L, "hardsigmoid_param", 501, "brocolli"),
    ForkField(_L, "unsqueeze_param", 502, "brocolli"),
    ForkField(_L, "relu6_param", 503, "brocolli"),
    ForkField(_L, "pad_param", 504, "brocolli"),
    ForkField(_L, "bilinear_interpolate_param", 505, "brocolli"),
    ForkField(_L, "max_unpool_param", 506, "brocolli"),
    ForkField(_L, "pixelshuffle_param", 507, "brocolli"),
    ForkField(_L, "proposal_param", 1000, "brocolli"),
    ForkField("caffe.BatchNormParameter", "weight_filler", 7, "brocolli"),
    ForkField("caffe.BatchNormParameter", "bias_filler", 8, "brocolli"),
    ForkField("caffe.BatchNormParameter", "use_alpha_beta", 9, "brocolli"),
    ForkField("caffe.BatchNormParameter", "do_all_reduce", 10, "brocolli"),
    ForkField("caffe.ConvolutionParameter", "width_group", 51, "brocolli"),
    ForkField("caffe.ConvolutionParameter", "height_group", 52, "brocolli"),
    ForkField("caffe.V1LayerParameter", "bn_param", 211, "brocolli"),
    ForkField("caffe.V1LayerParameter", "batch_norm_param", 139, "brocolli"),
    # Faster R-CNN family.
    ForkField(_L, "roi_pooling_param", 8266711, "frcnn"),
    ForkField(_L, "smooth_l1_loss_param", 8266712, "frcnn"),
    ForkField("caffe.DropoutParameter", "scale_train", 2, "frcnn"),
    ForkField(_L, "roi_pooling_param", 8266711, "R-FCN"),
    ForkField(_L, "smooth_l1_loss_param", 8266712, "R-FCN"),
    ForkField("caffe.DropoutParameter", "scale_train", 2, "R-FCN"),
    # Segmentation forks.
    ForkField(_L, "bn_param", 152, "PSPNet"),
    ForkField("caffe.LossParameter", "class_weighting", 4, "SegNet"),
    # SegNet declares scale as uint32 with default 2; ours is brocolli's int32 default 1.
    ForkField("caffe.UpsampleParameter", "scale", 1, "SegNet"),
    ForkField("caffe.UpsampleParameter", "scale_w", 3, "SegNet"),
    ForkField("caffe.UpsampleParameter", "pad_out_h", 4, "SegNet"),
    ForkField("caffe.UpsampleParameter", "pad_out_w", 5, "SegNet"),
    ForkField("caffe.UpsampleParameter", "upsample_h", 6, "SegNet"),
    ForkField("caffe.UpsampleParameter", "upsample_w", 7, "SegNet"),
    ForkField("caffe.InterpParameter", "use_blob_size", 7, "caffe-priv"),
    # Others.
    ForkField(_L, "shuffle_channel_param", 164, "ShuffleNet"),
    ForkField("caffe.DenseImageDataParameter", "label_divide_factor", 13, "ENet"),
)

FORK_MESSAGES: tuple[ForkMessage, ...] = (
    *(
        ForkMessage(f"caffe.{m}", "SSD")
        for m in (
            "LabelMapItem",
            "LabelMap",
            "Sampler",
            "SampleConstraint",
            "BatchSampler",
            "EmitConstraint",
            "NormalizedBBox",
            "Annotation",
            "AnnotationGroup",
            "AnnotatedDatum",
            "ResizeParameter",
            "SaltPepperParameter",
            "NoiseParameter",
            "DistortionParameter",
            "ExpansionParameter",
            "AnnotatedDataParameter",
            "DetectionEvaluateParameter",
            "NonMaximumSuppressionParameter",
            "SaveOutputParameter",
            "DetectionOutputParameter",
            "MultiBoxLossParameter",
            "NormalizeParameter",
            "PermuteParameter",
            "PriorBoxParameter",
            "VideoDataParameter",
        )
    ),
    ForkMessage("caffe.ROIPoolingParameter", "frcnn"),
    ForkMessage("caffe.SmoothL1LossParameter", "frcnn"),
    ForkMessage("caffe.PSROIPoolingParameter", "brocolli"),
    ForkMessage("caffe.InterpParameter", "PSPNet"),
    ForkMessage("caffe.BNParameter", "PSPNet"),
    ForkMessage("caffe.UpsampleParameter", "brocolli"),
    ForkMessage("caffe.DenseImageDataParameter", "SegNet"),
    ForkMessage("caffe.ShuffleChannelParameter", "ShuffleNet"),
    ForkMessage("caffe.InceptionColumnParameter", "brocolli"),
    ForkMessage("caffe.InceptionParameter", "brocolli"),
    ForkMessage("caffe.ResizeLayerParameter", "brocolli", fork_name="ResizeParameter"),
    ForkMessage("caffe.HardSigmoidParameter", "brocolli"),
    ForkMessage("caffe.UnsqueezeParameter", "brocolli"),
    ForkMessage("caffe.ReLU6Parameter", "brocolli"),
    ForkMessage("caffe.PadParameter", "brocolli"),
    ForkMessage("caffe.BilinearInterpolateParameter", "brocolli"),
    ForkMessage("caffe.MaxUnPoolParameter", "brocolli"),
    ForkMessage("caffe.PixelShuffleParameter", "brocolli"),
    ForkMessage("caffe.ProposalParameter", "brocolli"),
)

__all__ = [
    "FORKS",
    "FORK_FIELDS",
    "FORK_MESSAGES",
    "ForkField",
    "ForkMessage",
    "RELOCATED_FIELDS",
    "RelocatedField",
]
