from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Phase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAIN: _ClassVar[Phase]
    TEST: _ClassVar[Phase]
TRAIN: Phase
TEST: Phase

class BlobShape(_message.Message):
    __slots__ = ("dim",)
    DIM_FIELD_NUMBER: _ClassVar[int]
    dim: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dim: _Optional[_Iterable[int]] = ...) -> None: ...

class BlobProto(_message.Message):
    __slots__ = ("shape", "data", "diff", "double_data", "double_diff", "num", "channels", "height", "width")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DIFF_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_DATA_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_DIFF_FIELD_NUMBER: _ClassVar[int]
    NUM_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    shape: BlobShape
    data: _containers.RepeatedScalarFieldContainer[float]
    diff: _containers.RepeatedScalarFieldContainer[float]
    double_data: _containers.RepeatedScalarFieldContainer[float]
    double_diff: _containers.RepeatedScalarFieldContainer[float]
    num: int
    channels: int
    height: int
    width: int
    def __init__(self, shape: _Optional[_Union[BlobShape, _Mapping]] = ..., data: _Optional[_Iterable[float]] = ..., diff: _Optional[_Iterable[float]] = ..., double_data: _Optional[_Iterable[float]] = ..., double_diff: _Optional[_Iterable[float]] = ..., num: _Optional[int] = ..., channels: _Optional[int] = ..., height: _Optional[int] = ..., width: _Optional[int] = ...) -> None: ...

class BlobProtoVector(_message.Message):
    __slots__ = ("blobs",)
    BLOBS_FIELD_NUMBER: _ClassVar[int]
    blobs: _containers.RepeatedCompositeFieldContainer[BlobProto]
    def __init__(self, blobs: _Optional[_Iterable[_Union[BlobProto, _Mapping]]] = ...) -> None: ...

class Datum(_message.Message):
    __slots__ = ("channels", "height", "width", "data", "label", "float_data", "encoded")
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    FLOAT_DATA_FIELD_NUMBER: _ClassVar[int]
    ENCODED_FIELD_NUMBER: _ClassVar[int]
    channels: int
    height: int
    width: int
    data: bytes
    label: int
    float_data: _containers.RepeatedScalarFieldContainer[float]
    encoded: bool
    def __init__(self, channels: _Optional[int] = ..., height: _Optional[int] = ..., width: _Optional[int] = ..., data: _Optional[bytes] = ..., label: _Optional[int] = ..., float_data: _Optional[_Iterable[float]] = ..., encoded: _Optional[bool] = ...) -> None: ...

class LabelMapItem(_message.Message):
    __slots__ = ("name", "label", "display_name")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    label: int
    display_name: str
    def __init__(self, name: _Optional[str] = ..., label: _Optional[int] = ..., display_name: _Optional[str] = ...) -> None: ...

class LabelMap(_message.Message):
    __slots__ = ("item",)
    ITEM_FIELD_NUMBER: _ClassVar[int]
    item: _containers.RepeatedCompositeFieldContainer[LabelMapItem]
    def __init__(self, item: _Optional[_Iterable[_Union[LabelMapItem, _Mapping]]] = ...) -> None: ...

class Sampler(_message.Message):
    __slots__ = ("min_scale", "max_scale", "min_aspect_ratio", "max_aspect_ratio")
    MIN_SCALE_FIELD_NUMBER: _ClassVar[int]
    MAX_SCALE_FIELD_NUMBER: _ClassVar[int]
    MIN_ASPECT_RATIO_FIELD_NUMBER: _ClassVar[int]
    MAX_ASPECT_RATIO_FIELD_NUMBER: _ClassVar[int]
    min_scale: float
    max_scale: float
    min_aspect_ratio: float
    max_aspect_ratio: float
    def __init__(self, min_scale: _Optional[float] = ..., max_scale: _Optional[float] = ..., min_aspect_ratio: _Optional[float] = ..., max_aspect_ratio: _Optional[float] = ...) -> None: ...

class SampleConstraint(_message.Message):
    __slots__ = ("min_jaccard_overlap", "max_jaccard_overlap", "min_sample_coverage", "max_sample_coverage", "min_object_coverage", "max_object_coverage")
    MIN_JACCARD_OVERLAP_FIELD_NUMBER: _ClassVar[int]
    MAX_JACCARD_OVERLAP_FIELD_NUMBER: _ClassVar[int]
    MIN_SAMPLE_COVERAGE_FIELD_NUMBER: _ClassVar[int]
    MAX_SAMPLE_COVERAGE_FIELD_NUMBER: _ClassVar[int]
    MIN_OBJECT_COVERAGE_FIELD_NUMBER: _ClassVar[int]
    MAX_OBJECT_COVERAGE_FIELD_NUMBER: _ClassVar[int]
    min_jaccard_overlap: float
    max_jaccard_overlap: float
    min_sample_coverage: float
    max_sample_coverage: float
    min_object_coverage: float
    max_object_coverage: float
    def __init__(self, min_jaccard_overlap: _Optional[float] = ..., max_jaccard_overlap: _Optional[float] = ..., min_sample_coverage: _Optional[float] = ..., max_sample_coverage: _Optional[float] = ..., min_object_coverage: _Optional[float] = ..., max_object_coverage: _Optional[float] = ...) -> None: ...

class BatchSampler(_message.Message):
    __slots__ = ("use_original_image", "sampler", "sample_constraint", "max_sample", "max_trials")
    USE_ORIGINAL_IMAGE_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    MAX_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    MAX_TRIALS_FIELD_NUMBER: _ClassVar[int]
    use_original_image: bool
    sampler: Sampler
    sample_constraint: SampleConstraint
    max_sample: int
    max_trials: int
    def __init__(self, use_original_image: _Optional[bool] = ..., sampler: _Optional[_Union[Sampler, _Mapping]] = ..., sample_constraint: _Optional[_Union[SampleConstraint, _Mapping]] = ..., max_sample: _Optional[int] = ..., max_trials: _Optional[int] = ...) -> None: ...

class EmitConstraint(_message.Message):
    __slots__ = ("emit_type", "emit_overlap")
    class EmitType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        CENTER: _ClassVar[EmitConstraint.EmitType]
        MIN_OVERLAP: _ClassVar[EmitConstraint.EmitType]
    CENTER: EmitConstraint.EmitType
    MIN_OVERLAP: EmitConstraint.EmitType
    EMIT_TYPE_FIELD_NUMBER: _ClassVar[int]
    EMIT_OVERLAP_FIELD_NUMBER: _ClassVar[int]
    emit_type: EmitConstraint.EmitType
    emit_overlap: float
    def __init__(self, emit_type: _Optional[_Union[EmitConstraint.EmitType, str]] = ..., emit_overlap: _Optional[float] = ...) -> None: ...

class NormalizedBBox(_message.Message):
    __slots__ = ("xmin", "ymin", "xmax", "ymax", "label", "difficult", "score", "size")
    XMIN_FIELD_NUMBER: _ClassVar[int]
    YMIN_FIELD_NUMBER: _ClassVar[int]
    XMAX_FIELD_NUMBER: _ClassVar[int]
    YMAX_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    DIFFICULT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    xmin: float
    ymin: float
    xmax: float
    ymax: float
    label: int
    difficult: bool
    score: float
    size: float
    def __init__(self, xmin: _Optional[float] = ..., ymin: _Optional[float] = ..., xmax: _Optional[float] = ..., ymax: _Optional[float] = ..., label: _Optional[int] = ..., difficult: _Optional[bool] = ..., score: _Optional[float] = ..., size: _Optional[float] = ...) -> None: ...

class Annotation(_message.Message):
    __slots__ = ("instance_id", "bbox")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    BBOX_FIELD_NUMBER: _ClassVar[int]
    instance_id: int
    bbox: NormalizedBBox
    def __init__(self, instance_id: _Optional[int] = ..., bbox: _Optional[_Union[NormalizedBBox, _Mapping]] = ...) -> None: ...

class AnnotationGroup(_message.Message):
    __slots__ = ("group_label", "annotation")
    GROUP_LABEL_FIELD_NUMBER: _ClassVar[int]
    ANNOTATION_FIELD_NUMBER: _ClassVar[int]
    group_label: int
    annotation: _containers.RepeatedCompositeFieldContainer[Annotation]
    def __init__(self, group_label: _Optional[int] = ..., annotation: _Optional[_Iterable[_Union[Annotation, _Mapping]]] = ...) -> None: ...

class AnnotatedDatum(_message.Message):
    __slots__ = ("datum", "type", "annotation_group")
    class AnnotationType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        BBOX: _ClassVar[AnnotatedDatum.AnnotationType]
    BBOX: AnnotatedDatum.AnnotationType
    DATUM_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ANNOTATION_GROUP_FIELD_NUMBER: _ClassVar[int]
    datum: Datum
    type: AnnotatedDatum.AnnotationType
    annotation_group: _containers.RepeatedCompositeFieldContainer[AnnotationGroup]
    def __init__(self, datum: _Optional[_Union[Datum, _Mapping]] = ..., type: _Optional[_Union[AnnotatedDatum.AnnotationType, str]] = ..., annotation_group: _Optional[_Iterable[_Union[AnnotationGroup, _Mapping]]] = ...) -> None: ...

class FillerParameter(_message.Message):
    __slots__ = ("type", "value", "min", "max", "mean", "std", "sparse", "variance_norm")
    class VarianceNorm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        FAN_IN: _ClassVar[FillerParameter.VarianceNorm]
        FAN_OUT: _ClassVar[FillerParameter.VarianceNorm]
        AVERAGE: _ClassVar[FillerParameter.VarianceNorm]
    FAN_IN: FillerParameter.VarianceNorm
    FAN_OUT: FillerParameter.VarianceNorm
    AVERAGE: FillerParameter.VarianceNorm
    TYPE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    STD_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    VARIANCE_NORM_FIELD_NUMBER: _ClassVar[int]
    type: str
    value: float
    min: float
    max: float
    mean: float
    std: float
    sparse: int
    variance_norm: FillerParameter.VarianceNorm
    def __init__(self, type: _Optional[str] = ..., value: _Optional[float] = ..., min: _Optional[float] = ..., max: _Optional[float] = ..., mean: _Optional[float] = ..., std: _Optional[float] = ..., sparse: _Optional[int] = ..., variance_norm: _Optional[_Union[FillerParameter.VarianceNorm, str]] = ...) -> None: ...

class NetParameter(_message.Message):
    __slots__ = ("name", "input", "input_shape", "input_dim", "force_backward", "state", "debug_info", "layer", "layers")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    INPUT_SHAPE_FIELD_NUMBER: _ClassVar[int]
    INPUT_DIM_FIELD_NUMBER: _ClassVar[int]
    FORCE_BACKWARD_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DEBUG_INFO_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    input: _containers.RepeatedScalarFieldContainer[str]
    input_shape: _containers.RepeatedCompositeFieldContainer[BlobShape]
    input_dim: _containers.RepeatedScalarFieldContainer[int]
    force_backward: bool
    state: NetState
    debug_info: bool
    layer: _containers.RepeatedCompositeFieldContainer[LayerParameter]
    layers: _containers.RepeatedCompositeFieldContainer[V1LayerParameter]
    def __init__(self, name: _Optional[str] = ..., input: _Optional[_Iterable[str]] = ..., input_shape: _Optional[_Iterable[_Union[BlobShape, _Mapping]]] = ..., input_dim: _Optional[_Iterable[int]] = ..., force_backward: _Optional[bool] = ..., state: _Optional[_Union[NetState, _Mapping]] = ..., debug_info: _Optional[bool] = ..., layer: _Optional[_Iterable[_Union[LayerParameter, _Mapping]]] = ..., layers: _Optional[_Iterable[_Union[V1LayerParameter, _Mapping]]] = ...) -> None: ...

class SolverParameter(_message.Message):
    __slots__ = ("net", "net_param", "train_net", "test_net", "train_net_param", "test_net_param", "train_state", "test_state", "eval_type", "ap_version", "show_per_class_result", "test_iter", "test_interval", "test_compute_loss", "test_initialization", "base_lr", "display", "average_loss", "max_iter", "iter_size", "lr_policy", "gamma", "power", "momentum", "weight_decay", "regularization_type", "stepsize", "stepvalue", "plateau_winsize", "clip_gradients", "snapshot", "snapshot_prefix", "snapshot_diff", "snapshot_format", "solver_mode", "device_id", "random_seed", "type", "delta", "momentum2", "rms_decay", "debug_info", "snapshot_after_train", "solver_type", "layer_wise_reduce", "weights")
    class SnapshotFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        HDF5: _ClassVar[SolverParameter.SnapshotFormat]
        BINARYPROTO: _ClassVar[SolverParameter.SnapshotFormat]
    HDF5: SolverParameter.SnapshotFormat
    BINARYPROTO: SolverParameter.SnapshotFormat
    class SolverMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        CPU: _ClassVar[SolverParameter.SolverMode]
        GPU: _ClassVar[SolverParameter.SolverMode]
    CPU: SolverParameter.SolverMode
    GPU: SolverParameter.SolverMode
    class SolverType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SGD: _ClassVar[SolverParameter.SolverType]
        NESTEROV: _ClassVar[SolverParameter.SolverType]
        ADAGRAD: _ClassVar[SolverParameter.SolverType]
        RMSPROP: _ClassVar[SolverParameter.SolverType]
        ADADELTA: _ClassVar[SolverParameter.SolverType]
        ADAM: _ClassVar[SolverParameter.SolverType]
    SGD: SolverParameter.SolverType
    NESTEROV: SolverParameter.SolverType
    ADAGRAD: SolverParameter.SolverType
    RMSPROP: SolverParameter.SolverType
    ADADELTA: SolverParameter.SolverType
    ADAM: SolverParameter.SolverType
    NET_FIELD_NUMBER: _ClassVar[int]
    NET_PARAM_FIELD_NUMBER: _ClassVar[int]
    TRAIN_NET_FIELD_NUMBER: _ClassVar[int]
    TEST_NET_FIELD_NUMBER: _ClassVar[int]
    TRAIN_NET_PARAM_FIELD_NUMBER: _ClassVar[int]
    TEST_NET_PARAM_FIELD_NUMBER: _ClassVar[int]
    TRAIN_STATE_FIELD_NUMBER: _ClassVar[int]
    TEST_STATE_FIELD_NUMBER: _ClassVar[int]
    EVAL_TYPE_FIELD_NUMBER: _ClassVar[int]
    AP_VERSION_FIELD_NUMBER: _ClassVar[int]
    SHOW_PER_CLASS_RESULT_FIELD_NUMBER: _ClassVar[int]
    TEST_ITER_FIELD_NUMBER: _ClassVar[int]
    TEST_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    TEST_COMPUTE_LOSS_FIELD_NUMBER: _ClassVar[int]
    TEST_INITIALIZATION_FIELD_NUMBER: _ClassVar[int]
    BASE_LR_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_FIELD_NUMBER: _ClassVar[int]
    AVERAGE_LOSS_FIELD_NUMBER: _ClassVar[int]
    MAX_ITER_FIELD_NUMBER: _ClassVar[int]
    ITER_SIZE_FIELD_NUMBER: _ClassVar[int]
    LR_POLICY_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    POWER_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    REGULARIZATION_TYPE_FIELD_NUMBER: _ClassVar[int]
    STEPSIZE_FIELD_NUMBER: _ClassVar[int]
    STEPVALUE_FIELD_NUMBER: _ClassVar[int]
    PLATEAU_WINSIZE_FIELD_NUMBER: _ClassVar[int]
    CLIP_GRADIENTS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_PREFIX_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_DIFF_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    SOLVER_MODE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    RANDOM_SEED_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM2_FIELD_NUMBER: _ClassVar[int]
    RMS_DECAY_FIELD_NUMBER: _ClassVar[int]
    DEBUG_INFO_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_AFTER_TRAIN_FIELD_NUMBER: _ClassVar[int]
    SOLVER_TYPE_FIELD_NUMBER: _ClassVar[int]
    LAYER_WISE_REDUCE_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    net: str
    net_param: NetParameter
    train_net: str
    test_net: _containers.RepeatedScalarFieldContainer[str]
    train_net_param: NetParameter
    test_net_param: _containers.RepeatedCompositeFieldContainer[NetParameter]
    train_state: NetState
    test_state: _containers.RepeatedCompositeFieldContainer[NetState]
    eval_type: str
    ap_version: str
    show_per_class_result: bool
    test_iter: _containers.RepeatedScalarFieldContainer[int]
    test_interval: int
    test_compute_loss: bool
    test_initialization: bool
    base_lr: float
    display: int
    average_loss: int
    max_iter: int
    iter_size: int
    lr_policy: str
    gamma: float
    power: float
    momentum: float
    weight_decay: float
    regularization_type: str
    stepsize: int
    stepvalue: _containers.RepeatedScalarFieldContainer[int]
    plateau_winsize: _containers.RepeatedScalarFieldContainer[int]
    clip_gradients: float
    snapshot: int
    snapshot_prefix: str
    snapshot_diff: bool
    snapshot_format: SolverParameter.SnapshotFormat
    solver_mode: SolverParameter.SolverMode
    device_id: int
    random_seed: int
    type: str
    delta: float
    momentum2: float
    rms_decay: float
    debug_info: bool
    snapshot_after_train: bool
    solver_type: SolverParameter.SolverType
    layer_wise_reduce: bool
    weights: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, net: _Optional[str] = ..., net_param: _Optional[_Union[NetParameter, _Mapping]] = ..., train_net: _Optional[str] = ..., test_net: _Optional[_Iterable[str]] = ..., train_net_param: _Optional[_Union[NetParameter, _Mapping]] = ..., test_net_param: _Optional[_Iterable[_Union[NetParameter, _Mapping]]] = ..., train_state: _Optional[_Union[NetState, _Mapping]] = ..., test_state: _Optional[_Iterable[_Union[NetState, _Mapping]]] = ..., eval_type: _Optional[str] = ..., ap_version: _Optional[str] = ..., show_per_class_result: _Optional[bool] = ..., test_iter: _Optional[_Iterable[int]] = ..., test_interval: _Optional[int] = ..., test_compute_loss: _Optional[bool] = ..., test_initialization: _Optional[bool] = ..., base_lr: _Optional[float] = ..., display: _Optional[int] = ..., average_loss: _Optional[int] = ..., max_iter: _Optional[int] = ..., iter_size: _Optional[int] = ..., lr_policy: _Optional[str] = ..., gamma: _Optional[float] = ..., power: _Optional[float] = ..., momentum: _Optional[float] = ..., weight_decay: _Optional[float] = ..., regularization_type: _Optional[str] = ..., stepsize: _Optional[int] = ..., stepvalue: _Optional[_Iterable[int]] = ..., plateau_winsize: _Optional[_Iterable[int]] = ..., clip_gradients: _Optional[float] = ..., snapshot: _Optional[int] = ..., snapshot_prefix: _Optional[str] = ..., snapshot_diff: _Optional[bool] = ..., snapshot_format: _Optional[_Union[SolverParameter.SnapshotFormat, str]] = ..., solver_mode: _Optional[_Union[SolverParameter.SolverMode, str]] = ..., device_id: _Optional[int] = ..., random_seed: _Optional[int] = ..., type: _Optional[str] = ..., delta: _Optional[float] = ..., momentum2: _Optional[float] = ..., rms_decay: _Optional[float] = ..., debug_info: _Optional[bool] = ..., snapshot_after_train: _Optional[bool] = ..., solver_type: _Optional[_Union[SolverParameter.SolverType, str]] = ..., layer_wise_reduce: _Optional[bool] = ..., weights: _Optional[_Iterable[str]] = ...) -> None: ...

class SolverState(_message.Message):
    __slots__ = ("iter", "learned_net", "history", "current_step", "minimum_loss", "iter_last_event")
    ITER_FIELD_NUMBER: _ClassVar[int]
    LEARNED_NET_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    CURRENT_STEP_FIELD_NUMBER: _ClassVar[int]
    MINIMUM_LOSS_FIELD_NUMBER: _ClassVar[int]
    ITER_LAST_EVENT_FIELD_NUMBER: _ClassVar[int]
    iter: int
    learned_net: str
    history: _containers.RepeatedCompositeFieldContainer[BlobProto]
    current_step: int
    minimum_loss: float
    iter_last_event: int
    def __init__(self, iter: _Optional[int] = ..., learned_net: _Optional[str] = ..., history: _Optional[_Iterable[_Union[BlobProto, _Mapping]]] = ..., current_step: _Optional[int] = ..., minimum_loss: _Optional[float] = ..., iter_last_event: _Optional[int] = ...) -> None: ...

class NetState(_message.Message):
    __slots__ = ("phase", "level", "stage")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    phase: Phase
    level: int
    stage: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, phase: _Optional[_Union[Phase, str]] = ..., level: _Optional[int] = ..., stage: _Optional[_Iterable[str]] = ...) -> None: ...

class NetStateRule(_message.Message):
    __slots__ = ("phase", "min_level", "max_level", "stage", "not_stage")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    MIN_LEVEL_FIELD_NUMBER: _ClassVar[int]
    MAX_LEVEL_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    NOT_STAGE_FIELD_NUMBER: _ClassVar[int]
    phase: Phase
    min_level: int
    max_level: int
    stage: _containers.RepeatedScalarFieldContainer[str]
    not_stage: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, phase: _Optional[_Union[Phase, str]] = ..., min_level: _Optional[int] = ..., max_level: _Optional[int] = ..., stage: _Optional[_Iterable[str]] = ..., not_stage: _Optional[_Iterable[str]] = ...) -> None: ...

class ParamSpec(_message.Message):
    __slots__ = ("name", "share_mode", "lr_mult", "decay_mult")
    class DimCheckMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STRICT: _ClassVar[ParamSpec.DimCheckMode]
        PERMISSIVE: _ClassVar[ParamSpec.DimCheckMode]
    STRICT: ParamSpec.DimCheckMode
    PERMISSIVE: ParamSpec.DimCheckMode
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHARE_MODE_FIELD_NUMBER: _ClassVar[int]
    LR_MULT_FIELD_NUMBER: _ClassVar[int]
    DECAY_MULT_FIELD_NUMBER: _ClassVar[int]
    name: str
    share_mode: ParamSpec.DimCheckMode
    lr_mult: float
    decay_mult: float
    def __init__(self, name: _Optional[str] = ..., share_mode: _Optional[_Union[ParamSpec.DimCheckMode, str]] = ..., lr_mult: _Optional[float] = ..., decay_mult: _Optional[float] = ...) -> None: ...

class LayerParameter(_message.Message):
    __slots__ = ("name", "type", "bottom", "top", "phase", "loss_weight", "param", "blobs", "propagate_down", "include", "exclude", "transform_param", "loss_param", "accuracy_param", "annotated_data_param", "argmax_param", "batch_norm_param", "bias_param", "clip_param", "concat_param", "contrastive_loss_param", "convolution_param", "crop_param", "data_param", "detection_evaluate_param", "detection_output_param", "dropout_param", "dummy_data_param", "eltwise_param", "elu_param", "embed_param", "exp_param", "flatten_param", "hdf5_data_param", "hdf5_output_param", "hinge_loss_param", "image_data_param", "infogain_loss_param", "inner_product_param", "input_param", "log_param", "lrn_param", "memory_data_param", "multibox_loss_param", "mvn_param", "norm_param", "parameter_param", "permute_param", "pooling_param", "power_param", "prelu_param", "prior_box_param", "python_param", "recurrent_param", "reduction_param", "relu_param", "reshape_param", "scale_param", "sigmoid_param", "softmax_param", "spp_param", "slice_param", "swish_param", "tanh_param", "threshold_param", "tile_param", "video_data_param", "window_data_param", "roi_pooling_param", "smooth_l1_loss_param", "psroi_pooling_param", "bn_param", "shuffle_channel_param", "inception_param", "resize_param", "upsample_param", "hardsigmoid_param", "unsqueeze_param", "relu6_param", "pad_param", "bilinear_interpolate_param", "max_unpool_param", "pixelshuffle_param", "proposal_param", "interp_param", "dense_image_data_param")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    BOTTOM_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    LOSS_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    PARAM_FIELD_NUMBER: _ClassVar[int]
    BLOBS_FIELD_NUMBER: _ClassVar[int]
    PROPAGATE_DOWN_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    TRANSFORM_PARAM_FIELD_NUMBER: _ClassVar[int]
    LOSS_PARAM_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_PARAM_FIELD_NUMBER: _ClassVar[int]
    ANNOTATED_DATA_PARAM_FIELD_NUMBER: _ClassVar[int]
    ARGMAX_PARAM_FIELD_NUMBER: _ClassVar[int]
    BATCH_NORM_PARAM_FIELD_NUMBER: _ClassVar[int]
    BIAS_PARAM_FIELD_NUMBER: _ClassVar[int]
    CLIP_PARAM_FIELD_NUMBER: _ClassVar[int]
    CONCAT_PARAM_FIELD_NUMBER: _ClassVar[int]
    CONTRASTIVE_LOSS_PARAM_FIELD_NUMBER: _ClassVar[int]
    CONVOLUTION_PARAM_FIELD_NUMBER: _ClassVar[int]
    CROP_PARAM_FIELD_NUMBER: _ClassVar[int]
    DATA_PARAM_FIELD_NUMBER: _ClassVar[int]
    DETECTION_EVALUATE_PARAM_FIELD_NUMBER: _ClassVar[int]
    DETECTION_OUTPUT_PARAM_FIELD_NUMBER: _ClassVar[int]
    DROPOUT_PARAM_FIELD_NUMBER: _ClassVar[int]
    DUMMY_DATA_PARAM_FIELD_NUMBER: _ClassVar[int]
    ELTWISE_PARAM_FIELD_NUMBER: _ClassVar[int]
    ELU_PARAM_FIELD_NUMBER: _ClassVar[int]
    EMBED_PARAM_FIELD_NUMBER: _ClassVar[int]
    EXP_PARAM_FIELD_NUMBER: _ClassVar[int]
    FLATTEN_PARAM_FIELD_NUMBER: _ClassVar[int]
    HDF5_DATA_PARAM_FIELD_NUMBER: _ClassVar[int]
    HDF5_OUTPUT_PARAM_FIELD_NUMBER: _ClassVar[int]
    HINGE_LOSS_PARAM_FIELD_NUMBER: _ClassVar[int]
    IMAGE_DATA_PARAM_FIELD_NUMBER: _ClassVar[int]
    INFOGAIN_LOSS_PARAM_FIELD_NUMBER: _ClassVar[int]
    INNER_PRODUCT_PARAM_FIELD_NUMBER: _ClassVar[int]
    INPUT_PARAM_FIELD_NUMBER: _ClassVar[int]
    LOG_PARAM_FIELD_NUMBER: _ClassVar[int]
    LRN_PARAM_FIELD_NUMBER: _ClassVar[int]
    MEMORY_DATA_PARAM_FIELD_NUMBER: _ClassVar[int]
    MULTIBOX_LOSS_PARAM_FIELD_NUMBER: _ClassVar[int]
    MVN_PARAM_FIELD_NUMBER: _ClassVar[int]
    NORM_PARAM_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_PARAM_FIELD_NUMBER: _ClassVar[int]
    PERMUTE_PARAM_FIELD_NUMBER: _ClassVar[int]
    POOLING_PARAM_FIELD_NUMBER: _ClassVar[int]
    POWER_PARAM_FIELD_NUMBER: _ClassVar[int]
    PRELU_PARAM_FIELD_NUMBER: _ClassVar[int]
    PRIOR_BOX_PARAM_FIELD_NUMBER: _ClassVar[int]
    PYTHON_PARAM_FIELD_NUMBER: _ClassVar[int]
    RECURRENT_PARAM_FIELD_NUMBER: _ClassVar[int]
    REDUCTION_PARAM_FIELD_NUMBER: _ClassVar[int]
    RELU_PARAM_FIELD_NUMBER: _ClassVar[int]
    RESHAPE_PARAM_FIELD_NUMBER: _ClassVar[int]
    SCALE_PARAM_FIELD_NUMBER: _ClassVar[int]
    SIGMOID_PARAM_FIELD_NUMBER: _ClassVar[int]
    SOFTMAX_PARAM_FIELD_NUMBER: _ClassVar[int]
    SPP_PARAM_FIELD_NUMBER: _ClassVar[int]
    SLICE_PARAM_FIELD_NUMBER: _ClassVar[int]
    SWISH_PARAM_FIELD_NUMBER: _ClassVar[int]
    TANH_PARAM_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_PARAM_FIELD_NUMBER: _ClassVar[int]
    TILE_PARAM_FIELD_NUMBER: _ClassVar[int]
    VIDEO_DATA_PARAM_FIELD_NUMBER: _ClassVar[int]
    WINDOW_DATA_PARAM_FIELD_NUMBER: _ClassVar[int]
    ROI_POOLING_PARAM_FIELD_NUMBER: _ClassVar[int]
    SMOOTH_L1_LOSS_PARAM_FIELD_NUMBER: _ClassVar[int]
    PSROI_POOLING_PARAM_FIELD_NUMBER: _ClassVar[int]
    BN_PARAM_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_CHANNEL_PARAM_FIELD_NUMBER: _ClassVar[int]
    INCEPTION_PARAM_FIELD_NUMBER: _ClassVar[int]
    RESIZE_PARAM_FIELD_NUMBER: _ClassVar[int]
    UPSAMPLE_PARAM_FIELD_NUMBER: _ClassVar[int]
    HARDSIGMOID_PARAM_FIELD_NUMBER: _ClassVar[int]
    UNSQUEEZE_PARAM_FIELD_NUMBER: _ClassVar[int]
    RELU6_PARAM_FIELD_NUMBER: _ClassVar[int]
    PAD_PARAM_FIELD_NUMBER: _ClassVar[int]
    BILINEAR_INTERPOLATE_PARAM_FIELD_NUMBER: _ClassVar[int]
    MAX_UNPOOL_PARAM_FIELD_NUMBER: _ClassVar[int]
    PIXELSHUFFLE_PARAM_FIELD_NUMBER: _ClassVar[int]
    PROPOSAL_PARAM_FIELD_NUMBER: _ClassVar[int]
    INTERP_PARAM_FIELD_NUMBER: _ClassVar[int]
    DENSE_IMAGE_DATA_PARAM_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    bottom: _containers.RepeatedScalarFieldContainer[str]
    top: _containers.RepeatedScalarFieldContainer[str]
    phase: Phase
    loss_weight: _containers.RepeatedScalarFieldContainer[float]
    param: _containers.RepeatedCompositeFieldContainer[ParamSpec]
    blobs: _containers.RepeatedCompositeFieldContainer[BlobProto]
    propagate_down: _containers.RepeatedScalarFieldContainer[bool]
    include: _containers.RepeatedCompositeFieldContainer[NetStateRule]
    exclude: _containers.RepeatedCompositeFieldContainer[NetStateRule]
    transform_param: TransformationParameter
    loss_param: LossParameter
    accuracy_param: AccuracyParameter
    annotated_data_param: AnnotatedDataParameter
    argmax_param: ArgMaxParameter
    batch_norm_param: BatchNormParameter
    bias_param: BiasParameter
    clip_param: ClipParameter
    concat_param: ConcatParameter
    contrastive_loss_param: ContrastiveLossParameter
    convolution_param: ConvolutionParameter
    crop_param: CropParameter
    data_param: DataParameter
    detection_evaluate_param: DetectionEvaluateParameter
    detection_output_param: DetectionOutputParameter
    dropout_param: DropoutParameter
    dummy_data_param: DummyDataParameter
    eltwise_param: EltwiseParameter
    elu_param: ELUParameter
    embed_param: EmbedParameter
    exp_param: ExpParameter
    flatten_param: FlattenParameter
    hdf5_data_param: HDF5DataParameter
    hdf5_output_param: HDF5OutputParameter
    hinge_loss_param: HingeLossParameter
    image_data_param: ImageDataParameter
    infogain_loss_param: InfogainLossParameter
    inner_product_param: InnerProductParameter
    input_param: InputParameter
    log_param: LogParameter
    lrn_param: LRNParameter
    memory_data_param: MemoryDataParameter
    multibox_loss_param: MultiBoxLossParameter
    mvn_param: MVNParameter
    norm_param: NormalizeParameter
    parameter_param: ParameterParameter
    permute_param: PermuteParameter
    pooling_param: PoolingParameter
    power_param: PowerParameter
    prelu_param: PReLUParameter
    prior_box_param: PriorBoxParameter
    python_param: PythonParameter
    recurrent_param: RecurrentParameter
    reduction_param: ReductionParameter
    relu_param: ReLUParameter
    reshape_param: ReshapeParameter
    scale_param: ScaleParameter
    sigmoid_param: SigmoidParameter
    softmax_param: SoftmaxParameter
    spp_param: SPPParameter
    slice_param: SliceParameter
    swish_param: SwishParameter
    tanh_param: TanHParameter
    threshold_param: ThresholdParameter
    tile_param: TileParameter
    video_data_param: VideoDataParameter
    window_data_param: WindowDataParameter
    roi_pooling_param: ROIPoolingParameter
    smooth_l1_loss_param: SmoothL1LossParameter
    psroi_pooling_param: PSROIPoolingParameter
    bn_param: BNParameter
    shuffle_channel_param: ShuffleChannelParameter
    inception_param: InceptionParameter
    resize_param: ResizeLayerParameter
    upsample_param: UpsampleParameter
    hardsigmoid_param: HardSigmoidParameter
    unsqueeze_param: UnsqueezeParameter
    relu6_param: ReLU6Parameter
    pad_param: PadParameter
    bilinear_interpolate_param: BilinearInterpolateParameter
    max_unpool_param: MaxUnPoolParameter
    pixelshuffle_param: PixelShuffleParameter
    proposal_param: ProposalParameter
    interp_param: InterpParameter
    dense_image_data_param: DenseImageDataParameter
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., bottom: _Optional[_Iterable[str]] = ..., top: _Optional[_Iterable[str]] = ..., phase: _Optional[_Union[Phase, str]] = ..., loss_weight: _Optional[_Iterable[float]] = ..., param: _Optional[_Iterable[_Union[ParamSpec, _Mapping]]] = ..., blobs: _Optional[_Iterable[_Union[BlobProto, _Mapping]]] = ..., propagate_down: _Optional[_Iterable[bool]] = ..., include: _Optional[_Iterable[_Union[NetStateRule, _Mapping]]] = ..., exclude: _Optional[_Iterable[_Union[NetStateRule, _Mapping]]] = ..., transform_param: _Optional[_Union[TransformationParameter, _Mapping]] = ..., loss_param: _Optional[_Union[LossParameter, _Mapping]] = ..., accuracy_param: _Optional[_Union[AccuracyParameter, _Mapping]] = ..., annotated_data_param: _Optional[_Union[AnnotatedDataParameter, _Mapping]] = ..., argmax_param: _Optional[_Union[ArgMaxParameter, _Mapping]] = ..., batch_norm_param: _Optional[_Union[BatchNormParameter, _Mapping]] = ..., bias_param: _Optional[_Union[BiasParameter, _Mapping]] = ..., clip_param: _Optional[_Union[ClipParameter, _Mapping]] = ..., concat_param: _Optional[_Union[ConcatParameter, _Mapping]] = ..., contrastive_loss_param: _Optional[_Union[ContrastiveLossParameter, _Mapping]] = ..., convolution_param: _Optional[_Union[ConvolutionParameter, _Mapping]] = ..., crop_param: _Optional[_Union[CropParameter, _Mapping]] = ..., data_param: _Optional[_Union[DataParameter, _Mapping]] = ..., detection_evaluate_param: _Optional[_Union[DetectionEvaluateParameter, _Mapping]] = ..., detection_output_param: _Optional[_Union[DetectionOutputParameter, _Mapping]] = ..., dropout_param: _Optional[_Union[DropoutParameter, _Mapping]] = ..., dummy_data_param: _Optional[_Union[DummyDataParameter, _Mapping]] = ..., eltwise_param: _Optional[_Union[EltwiseParameter, _Mapping]] = ..., elu_param: _Optional[_Union[ELUParameter, _Mapping]] = ..., embed_param: _Optional[_Union[EmbedParameter, _Mapping]] = ..., exp_param: _Optional[_Union[ExpParameter, _Mapping]] = ..., flatten_param: _Optional[_Union[FlattenParameter, _Mapping]] = ..., hdf5_data_param: _Optional[_Union[HDF5DataParameter, _Mapping]] = ..., hdf5_output_param: _Optional[_Union[HDF5OutputParameter, _Mapping]] = ..., hinge_loss_param: _Optional[_Union[HingeLossParameter, _Mapping]] = ..., image_data_param: _Optional[_Union[ImageDataParameter, _Mapping]] = ..., infogain_loss_param: _Optional[_Union[InfogainLossParameter, _Mapping]] = ..., inner_product_param: _Optional[_Union[InnerProductParameter, _Mapping]] = ..., input_param: _Optional[_Union[InputParameter, _Mapping]] = ..., log_param: _Optional[_Union[LogParameter, _Mapping]] = ..., lrn_param: _Optional[_Union[LRNParameter, _Mapping]] = ..., memory_data_param: _Optional[_Union[MemoryDataParameter, _Mapping]] = ..., multibox_loss_param: _Optional[_Union[MultiBoxLossParameter, _Mapping]] = ..., mvn_param: _Optional[_Union[MVNParameter, _Mapping]] = ..., norm_param: _Optional[_Union[NormalizeParameter, _Mapping]] = ..., parameter_param: _Optional[_Union[ParameterParameter, _Mapping]] = ..., permute_param: _Optional[_Union[PermuteParameter, _Mapping]] = ..., pooling_param: _Optional[_Union[PoolingParameter, _Mapping]] = ..., power_param: _Optional[_Union[PowerParameter, _Mapping]] = ..., prelu_param: _Optional[_Union[PReLUParameter, _Mapping]] = ..., prior_box_param: _Optional[_Union[PriorBoxParameter, _Mapping]] = ..., python_param: _Optional[_Union[PythonParameter, _Mapping]] = ..., recurrent_param: _Optional[_Union[RecurrentParameter, _Mapping]] = ..., reduction_param: _Optional[_Union[ReductionParameter, _Mapping]] = ..., relu_param: _Optional[_Union[ReLUParameter, _Mapping]] = ..., reshape_param: _Optional[_Union[ReshapeParameter, _Mapping]] = ..., scale_param: _Optional[_Union[ScaleParameter, _Mapping]] = ..., sigmoid_param: _Optional[_Union[SigmoidParameter, _Mapping]] = ..., softmax_param: _Optional[_Union[SoftmaxParameter, _Mapping]] = ..., spp_param: _Optional[_Union[SPPParameter, _Mapping]] = ..., slice_param: _Optional[_Union[SliceParameter, _Mapping]] = ..., swish_param: _Optional[_Union[SwishParameter, _Mapping]] = ..., tanh_param: _Optional[_Union[TanHParameter, _Mapping]] = ..., threshold_param: _Optional[_Union[ThresholdParameter, _Mapping]] = ..., tile_param: _Optional[_Union[TileParameter, _Mapping]] = ..., video_data_param: _Optional[_Union[VideoDataParameter, _Mapping]] = ..., window_data_param: _Optional[_Union[WindowDataParameter, _Mapping]] = ..., roi_pooling_param: _Optional[_Union[ROIPoolingParameter, _Mapping]] = ..., smooth_l1_loss_param: _Optional[_Union[SmoothL1LossParameter, _Mapping]] = ..., psroi_pooling_param: _Optional[_Union[PSROIPoolingParameter, _Mapping]] = ..., bn_param: _Optional[_Union[BNParameter, _Mapping]] = ..., shuffle_channel_param: _Optional[_Union[ShuffleChannelParameter, _Mapping]] = ..., inception_param: _Optional[_Union[InceptionParameter, _Mapping]] = ..., resize_param: _Optional[_Union[ResizeLayerParameter, _Mapping]] = ..., upsample_param: _Optional[_Union[UpsampleParameter, _Mapping]] = ..., hardsigmoid_param: _Optional[_Union[HardSigmoidParameter, _Mapping]] = ..., unsqueeze_param: _Optional[_Union[UnsqueezeParameter, _Mapping]] = ..., relu6_param: _Optional[_Union[ReLU6Parameter, _Mapping]] = ..., pad_param: _Optional[_Union[PadParameter, _Mapping]] = ..., bilinear_interpolate_param: _Optional[_Union[BilinearInterpolateParameter, _Mapping]] = ..., max_unpool_param: _Optional[_Union[MaxUnPoolParameter, _Mapping]] = ..., pixelshuffle_param: _Optional[_Union[PixelShuffleParameter, _Mapping]] = ..., proposal_param: _Optional[_Union[ProposalParameter, _Mapping]] = ..., interp_param: _Optional[_Union[InterpParameter, _Mapping]] = ..., dense_image_data_param: _Optional[_Union[DenseImageDataParameter, _Mapping]] = ...) -> None: ...

class TransformationParameter(_message.Message):
    __slots__ = ("scale", "mirror", "crop_size", "crop_h", "crop_w", "mean_file", "mean_value", "force_color", "force_gray", "resize_param", "noise_param", "distort_param", "expand_param", "emit_constraint")
    SCALE_FIELD_NUMBER: _ClassVar[int]
    MIRROR_FIELD_NUMBER: _ClassVar[int]
    CROP_SIZE_FIELD_NUMBER: _ClassVar[int]
    CROP_H_FIELD_NUMBER: _ClassVar[int]
    CROP_W_FIELD_NUMBER: _ClassVar[int]
    MEAN_FILE_FIELD_NUMBER: _ClassVar[int]
    MEAN_VALUE_FIELD_NUMBER: _ClassVar[int]
    FORCE_COLOR_FIELD_NUMBER: _ClassVar[int]
    FORCE_GRAY_FIELD_NUMBER: _ClassVar[int]
    RESIZE_PARAM_FIELD_NUMBER: _ClassVar[int]
    NOISE_PARAM_FIELD_NUMBER: _ClassVar[int]
    DISTORT_PARAM_FIELD_NUMBER: _ClassVar[int]
    EXPAND_PARAM_FIELD_NUMBER: _ClassVar[int]
    EMIT_CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    scale: float
    mirror: bool
    crop_size: int
    crop_h: int
    crop_w: int
    mean_file: str
    mean_value: _containers.RepeatedScalarFieldContainer[float]
    force_color: bool
    force_gray: bool
    resize_param: ResizeParameter
    noise_param: NoiseParameter
    distort_param: DistortionParameter
    expand_param: ExpansionParameter
    emit_constraint: EmitConstraint
    def __init__(self, scale: _Optional[float] = ..., mirror: _Optional[bool] = ..., crop_size: _Optional[int] = ..., crop_h: _Optional[int] = ..., crop_w: _Optional[int] = ..., mean_file: _Optional[str] = ..., mean_value: _Optional[_Iterable[float]] = ..., force_color: _Optional[bool] = ..., force_gray: _Optional[bool] = ..., resize_param: _Optional[_Union[ResizeParameter, _Mapping]] = ..., noise_param: _Optional[_Union[NoiseParameter, _Mapping]] = ..., distort_param: _Optional[_Union[DistortionParameter, _Mapping]] = ..., expand_param: _Optional[_Union[ExpansionParameter, _Mapping]] = ..., emit_constraint: _Optional[_Union[EmitConstraint, _Mapping]] = ...) -> None: ...

class ResizeParameter(_message.Message):
    __slots__ = ("prob", "resize_mode", "height", "width", "height_scale", "width_scale", "pad_mode", "pad_value", "interp_mode")
    class Resize_mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        WARP: _ClassVar[ResizeParameter.Resize_mode]
        FIT_SMALL_SIZE: _ClassVar[ResizeParameter.Resize_mode]
        FIT_LARGE_SIZE_AND_PAD: _ClassVar[ResizeParameter.Resize_mode]
    WARP: ResizeParameter.Resize_mode
    FIT_SMALL_SIZE: ResizeParameter.Resize_mode
    FIT_LARGE_SIZE_AND_PAD: ResizeParameter.Resize_mode
    class Pad_mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        CONSTANT: _ClassVar[ResizeParameter.Pad_mode]
        MIRRORED: _ClassVar[ResizeParameter.Pad_mode]
        REPEAT_NEAREST: _ClassVar[ResizeParameter.Pad_mode]
    CONSTANT: ResizeParameter.Pad_mode
    MIRRORED: ResizeParameter.Pad_mode
    REPEAT_NEAREST: ResizeParameter.Pad_mode
    class Interp_mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        LINEAR: _ClassVar[ResizeParameter.Interp_mode]
        AREA: _ClassVar[ResizeParameter.Interp_mode]
        NEAREST: _ClassVar[ResizeParameter.Interp_mode]
        CUBIC: _ClassVar[ResizeParameter.Interp_mode]
        LANCZOS4: _ClassVar[ResizeParameter.Interp_mode]
    LINEAR: ResizeParameter.Interp_mode
    AREA: ResizeParameter.Interp_mode
    NEAREST: ResizeParameter.Interp_mode
    CUBIC: ResizeParameter.Interp_mode
    LANCZOS4: ResizeParameter.Interp_mode
    PROB_FIELD_NUMBER: _ClassVar[int]
    RESIZE_MODE_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_SCALE_FIELD_NUMBER: _ClassVar[int]
    WIDTH_SCALE_FIELD_NUMBER: _ClassVar[int]
    PAD_MODE_FIELD_NUMBER: _ClassVar[int]
    PAD_VALUE_FIELD_NUMBER: _ClassVar[int]
    INTERP_MODE_FIELD_NUMBER: _ClassVar[int]
    prob: float
    resize_mode: ResizeParameter.Resize_mode
    height: int
    width: int
    height_scale: int
    width_scale: int
    pad_mode: ResizeParameter.Pad_mode
    pad_value: _containers.RepeatedScalarFieldContainer[float]
    interp_mode: _containers.RepeatedScalarFieldContainer[ResizeParameter.Interp_mode]
    def __init__(self, prob: _Optional[float] = ..., resize_mode: _Optional[_Union[ResizeParameter.Resize_mode, str]] = ..., height: _Optional[int] = ..., width: _Optional[int] = ..., height_scale: _Optional[int] = ..., width_scale: _Optional[int] = ..., pad_mode: _Optional[_Union[ResizeParameter.Pad_mode, str]] = ..., pad_value: _Optional[_Iterable[float]] = ..., interp_mode: _Optional[_Iterable[_Union[ResizeParameter.Interp_mode, str]]] = ...) -> None: ...

class SaltPepperParameter(_message.Message):
    __slots__ = ("fraction", "value")
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    fraction: float
    value: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, fraction: _Optional[float] = ..., value: _Optional[_Iterable[float]] = ...) -> None: ...

class NoiseParameter(_message.Message):
    __slots__ = ("prob", "hist_eq", "inverse", "decolorize", "gauss_blur", "jpeg", "posterize", "erode", "saltpepper", "saltpepper_param", "clahe", "convert_to_hsv", "convert_to_lab")
    PROB_FIELD_NUMBER: _ClassVar[int]
    HIST_EQ_FIELD_NUMBER: _ClassVar[int]
    INVERSE_FIELD_NUMBER: _ClassVar[int]
    DECOLORIZE_FIELD_NUMBER: _ClassVar[int]
    GAUSS_BLUR_FIELD_NUMBER: _ClassVar[int]
    JPEG_FIELD_NUMBER: _ClassVar[int]
    POSTERIZE_FIELD_NUMBER: _ClassVar[int]
    ERODE_FIELD_NUMBER: _ClassVar[int]
    SALTPEPPER_FIELD_NUMBER: _ClassVar[int]
    SALTPEPPER_PARAM_FIELD_NUMBER: _ClassVar[int]
    CLAHE_FIELD_NUMBER: _ClassVar[int]
    CONVERT_TO_HSV_FIELD_NUMBER: _ClassVar[int]
    CONVERT_TO_LAB_FIELD_NUMBER: _ClassVar[int]
    prob: float
    hist_eq: bool
    inverse: bool
    decolorize: bool
    gauss_blur: bool
    jpeg: float
    posterize: bool
    erode: bool
    saltpepper: bool
    saltpepper_param: SaltPepperParameter
    clahe: bool
    convert_to_hsv: bool
    convert_to_lab: bool
    def __init__(self, prob: _Optional[float] = ..., hist_eq: _Optional[bool] = ..., inverse: _Optional[bool] = ..., decolorize: _Optional[bool] = ..., gauss_blur: _Optional[bool] = ..., jpeg: _Optional[float] = ..., posterize: _Optional[bool] = ..., erode: _Optional[bool] = ..., saltpepper: _Optional[bool] = ..., saltpepper_param: _Optional[_Union[SaltPepperParameter, _Mapping]] = ..., clahe: _Optional[bool] = ..., convert_to_hsv: _Optional[bool] = ..., convert_to_lab: _Optional[bool] = ...) -> None: ...

class DistortionParameter(_message.Message):
    __slots__ = ("brightness_prob", "brightness_delta", "contrast_prob", "contrast_lower", "contrast_upper", "hue_prob", "hue_delta", "saturation_prob", "saturation_lower", "saturation_upper", "random_order_prob")
    BRIGHTNESS_PROB_FIELD_NUMBER: _ClassVar[int]
    BRIGHTNESS_DELTA_FIELD_NUMBER: _ClassVar[int]
    CONTRAST_PROB_FIELD_NUMBER: _ClassVar[int]
    CONTRAST_LOWER_FIELD_NUMBER: _ClassVar[int]
    CONTRAST_UPPER_FIELD_NUMBER: _ClassVar[int]
    HUE_PROB_FIELD_NUMBER: _ClassVar[int]
    HUE_DELTA_FIELD_NUMBER: _ClassVar[int]
    SATURATION_PROB_FIELD_NUMBER: _ClassVar[int]
    SATURATION_LOWER_FIELD_NUMBER: _ClassVar[int]
    SATURATION_UPPER_FIELD_NUMBER: _ClassVar[int]
    RANDOM_ORDER_PROB_FIELD_NUMBER: _ClassVar[int]
    brightness_prob: float
    brightness_delta: float
    contrast_prob: float
    contrast_lower: float
    contrast_upper: float
    hue_prob: float
    hue_delta: float
    saturation_prob: float
    saturation_lower: float
    saturation_upper: float
    random_order_prob: float
    def __init__(self, brightness_prob: _Optional[float] = ..., brightness_delta: _Optional[float] = ..., contrast_prob: _Optional[float] = ..., contrast_lower: _Optional[float] = ..., contrast_upper: _Optional[float] = ..., hue_prob: _Optional[float] = ..., hue_delta: _Optional[float] = ..., saturation_prob: _Optional[float] = ..., saturation_lower: _Optional[float] = ..., saturation_upper: _Optional[float] = ..., random_order_prob: _Optional[float] = ...) -> None: ...

class ExpansionParameter(_message.Message):
    __slots__ = ("prob", "max_expand_ratio")
    PROB_FIELD_NUMBER: _ClassVar[int]
    MAX_EXPAND_RATIO_FIELD_NUMBER: _ClassVar[int]
    prob: float
    max_expand_ratio: float
    def __init__(self, prob: _Optional[float] = ..., max_expand_ratio: _Optional[float] = ...) -> None: ...

class LossParameter(_message.Message):
    __slots__ = ("ignore_label", "normalization", "normalize", "weight_by_label_freqs", "class_weighting")
    class NormalizationMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        FULL: _ClassVar[LossParameter.NormalizationMode]
        VALID: _ClassVar[LossParameter.NormalizationMode]
        BATCH_SIZE: _ClassVar[LossParameter.NormalizationMode]
        NONE: _ClassVar[LossParameter.NormalizationMode]
    FULL: LossParameter.NormalizationMode
    VALID: LossParameter.NormalizationMode
    BATCH_SIZE: LossParameter.NormalizationMode
    NONE: LossParameter.NormalizationMode
    IGNORE_LABEL_FIELD_NUMBER: _ClassVar[int]
    NORMALIZATION_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BY_LABEL_FREQS_FIELD_NUMBER: _ClassVar[int]
    CLASS_WEIGHTING_FIELD_NUMBER: _ClassVar[int]
    ignore_label: int
    normalization: LossParameter.NormalizationMode
    normalize: bool
    weight_by_label_freqs: bool
    class_weighting: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, ignore_label: _Optional[int] = ..., normalization: _Optional[_Union[LossParameter.NormalizationMode, str]] = ..., normalize: _Optional[bool] = ..., weight_by_label_freqs: _Optional[bool] = ..., class_weighting: _Optional[_Iterable[float]] = ...) -> None: ...

class AccuracyParameter(_message.Message):
    __slots__ = ("top_k", "axis", "ignore_label")
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    AXIS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_LABEL_FIELD_NUMBER: _ClassVar[int]
    top_k: int
    axis: int
    ignore_label: int
    def __init__(self, top_k: _Optional[int] = ..., axis: _Optional[int] = ..., ignore_label: _Optional[int] = ...) -> None: ...

class AnnotatedDataParameter(_message.Message):
    __slots__ = ("batch_sampler", "label_map_file", "anno_type")
    BATCH_SAMPLER_FIELD_NUMBER: _ClassVar[int]
    LABEL_MAP_FILE_FIELD_NUMBER: _ClassVar[int]
    ANNO_TYPE_FIELD_NUMBER: _ClassVar[int]
    batch_sampler: _containers.RepeatedCompositeFieldContainer[BatchSampler]
    label_map_file: str
    anno_type: AnnotatedDatum.AnnotationType
    def __init__(self, batch_sampler: _Optional[_Iterable[_Union[BatchSampler, _Mapping]]] = ..., label_map_file: _Optional[str] = ..., anno_type: _Optional[_Union[AnnotatedDatum.AnnotationType, str]] = ...) -> None: ...

class ArgMaxParameter(_message.Message):
    __slots__ = ("out_max_val", "top_k", "axis")
    OUT_MAX_VAL_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    AXIS_FIELD_NUMBER: _ClassVar[int]
    out_max_val: bool
    top_k: int
    axis: int
    def __init__(self, out_max_val: _Optional[bool] = ..., top_k: _Optional[int] = ..., axis: _Optional[int] = ...) -> None: ...

class ClipParameter(_message.Message):
    __slots__ = ("min", "max")
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    min: float
    max: float
    def __init__(self, min: _Optional[float] = ..., max: _Optional[float] = ...) -> None: ...

class ConcatParameter(_message.Message):
    __slots__ = ("axis", "concat_dim")
    AXIS_FIELD_NUMBER: _ClassVar[int]
    CONCAT_DIM_FIELD_NUMBER: _ClassVar[int]
    axis: int
    concat_dim: int
    def __init__(self, axis: _Optional[int] = ..., concat_dim: _Optional[int] = ...) -> None: ...

class BatchNormParameter(_message.Message):
    __slots__ = ("use_global_stats", "moving_average_fraction", "eps", "weight_filler", "bias_filler", "use_alpha_beta", "do_all_reduce")
    USE_GLOBAL_STATS_FIELD_NUMBER: _ClassVar[int]
    MOVING_AVERAGE_FRACTION_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FILLER_FIELD_NUMBER: _ClassVar[int]
    BIAS_FILLER_FIELD_NUMBER: _ClassVar[int]
    USE_ALPHA_BETA_FIELD_NUMBER: _ClassVar[int]
    DO_ALL_REDUCE_FIELD_NUMBER: _ClassVar[int]
    use_global_stats: bool
    moving_average_fraction: float
    eps: float
    weight_filler: FillerParameter
    bias_filler: FillerParameter
    use_alpha_beta: bool
    do_all_reduce: bool
    def __init__(self, use_global_stats: _Optional[bool] = ..., moving_average_fraction: _Optional[float] = ..., eps: _Optional[float] = ..., weight_filler: _Optional[_Union[FillerParameter, _Mapping]] = ..., bias_filler: _Optional[_Union[FillerParameter, _Mapping]] = ..., use_alpha_beta: _Optional[bool] = ..., do_all_reduce: _Optional[bool] = ...) -> None: ...

class BiasParameter(_message.Message):
    __slots__ = ("axis", "num_axes", "filler")
    AXIS_FIELD_NUMBER: _ClassVar[int]
    NUM_AXES_FIELD_NUMBER: _ClassVar[int]
    FILLER_FIELD_NUMBER: _ClassVar[int]
    axis: int
    num_axes: int
    filler: FillerParameter
    def __init__(self, axis: _Optional[int] = ..., num_axes: _Optional[int] = ..., filler: _Optional[_Union[FillerParameter, _Mapping]] = ...) -> None: ...

class ContrastiveLossParameter(_message.Message):
    __slots__ = ("margin", "legacy_version")
    MARGIN_FIELD_NUMBER: _ClassVar[int]
    LEGACY_VERSION_FIELD_NUMBER: _ClassVar[int]
    margin: float
    legacy_version: bool
    def __init__(self, margin: _Optional[float] = ..., legacy_version: _Optional[bool] = ...) -> None: ...

class ConvolutionParameter(_message.Message):
    __slots__ = ("num_output", "bias_term", "pad", "kernel_size", "stride", "dilation", "pad_h", "pad_w", "kernel_h", "kernel_w", "stride_h", "stride_w", "group", "width_group", "height_group", "weight_filler", "bias_filler", "engine", "axis", "force_nd_im2col")
    class Engine(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        DEFAULT: _ClassVar[ConvolutionParameter.Engine]
        CAFFE: _ClassVar[ConvolutionParameter.Engine]
        CUDNN: _ClassVar[ConvolutionParameter.Engine]
    DEFAULT: ConvolutionParameter.Engine
    CAFFE: ConvolutionParameter.Engine
    CUDNN: ConvolutionParameter.Engine
    NUM_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    BIAS_TERM_FIELD_NUMBER: _ClassVar[int]
    PAD_FIELD_NUMBER: _ClassVar[int]
    KERNEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    DILATION_FIELD_NUMBER: _ClassVar[int]
    PAD_H_FIELD_NUMBER: _ClassVar[int]
    PAD_W_FIELD_NUMBER: _ClassVar[int]
    KERNEL_H_FIELD_NUMBER: _ClassVar[int]
    KERNEL_W_FIELD_NUMBER: _ClassVar[int]
    STRIDE_H_FIELD_NUMBER: _ClassVar[int]
    STRIDE_W_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    WIDTH_GROUP_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_GROUP_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FILLER_FIELD_NUMBER: _ClassVar[int]
    BIAS_FILLER_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    AXIS_FIELD_NUMBER: _ClassVar[int]
    FORCE_ND_IM2COL_FIELD_NUMBER: _ClassVar[int]
    num_output: int
    bias_term: bool
    pad: _containers.RepeatedScalarFieldContainer[int]
    kernel_size: _containers.RepeatedScalarFieldContainer[int]
    stride: _containers.RepeatedScalarFieldContainer[int]
    dilation: _containers.RepeatedScalarFieldContainer[int]
    pad_h: int
    pad_w: int
    kernel_h: int
    kernel_w: int
    stride_h: int
    stride_w: int
    group: int
    width_group: int
    height_group: int
    weight_filler: FillerParameter
    bias_filler: FillerParameter
    engine: ConvolutionParameter.Engine
    axis: int
    force_nd_im2col: bool
    def __init__(self, num_output: _Optional[int] = ..., bias_term: _Optional[bool] = ..., pad: _Optional[_Iterable[int]] = ..., kernel_size: _Optional[_Iterable[int]] = ..., stride: _Optional[_Iterable[int]] = ..., dilation: _Optional[_Iterable[int]] = ..., pad_h: _Optional[int] = ..., pad_w: _Optional[int] = ..., kernel_h: _Optional[int] = ..., kernel_w: _Optional[int] = ..., stride_h: _Optional[int] = ..., stride_w: _Optional[int] = ..., group: _Optional[int] = ..., width_group: _Optional[int] = ..., height_group: _Optional[int] = ..., weight_filler: _Optional[_Union[FillerParameter, _Mapping]] = ..., bias_filler: _Optional[_Union[FillerParameter, _Mapping]] = ..., engine: _Optional[_Union[ConvolutionParameter.Engine, str]] = ..., axis: _Optional[int] = ..., force_nd_im2col: _Optional[bool] = ...) -> None: ...

class CropParameter(_message.Message):
    __slots__ = ("axis", "offset")
    AXIS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    axis: int
    offset: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, axis: _Optional[int] = ..., offset: _Optional[_Iterable[int]] = ...) -> None: ...

class DataParameter(_message.Message):
    __slots__ = ("source", "batch_size", "rand_skip", "backend", "scale", "mean_file", "crop_size", "mirror", "force_encoded_color", "prefetch")
    class DB(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        LEVELDB: _ClassVar[DataParameter.DB]
        LMDB: _ClassVar[DataParameter.DB]
    LEVELDB: DataParameter.DB
    LMDB: DataParameter.DB
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    RAND_SKIP_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    MEAN_FILE_FIELD_NUMBER: _ClassVar[int]
    CROP_SIZE_FIELD_NUMBER: _ClassVar[int]
    MIRROR_FIELD_NUMBER: _ClassVar[int]
    FORCE_ENCODED_COLOR_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_FIELD_NUMBER: _ClassVar[int]
    source: str
    batch_size: int
    rand_skip: int
    backend: DataParameter.DB
    scale: float
    mean_file: str
    crop_size: int
    mirror: bool
    force_encoded_color: bool
    prefetch: int
    def __init__(self, source: _Optional[str] = ..., batch_size: _Optional[int] = ..., rand_skip: _Optional[int] = ..., backend: _Optional[_Union[DataParameter.DB, str]] = ..., scale: _Optional[float] = ..., mean_file: _Optional[str] = ..., crop_size: _Optional[int] = ..., mirror: _Optional[bool] = ..., force_encoded_color: _Optional[bool] = ..., prefetch: _Optional[int] = ...) -> None: ...

class DetectionEvaluateParameter(_message.Message):
    __slots__ = ("num_classes", "background_label_id", "overlap_threshold", "evaluate_difficult_gt", "name_size_file", "resize_param")
    NUM_CLASSES_FIELD_NUMBER: _ClassVar[int]
    BACKGROUND_LABEL_ID_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    EVALUATE_DIFFICULT_GT_FIELD_NUMBER: _ClassVar[int]
    NAME_SIZE_FILE_FIELD_NUMBER: _ClassVar[int]
    RESIZE_PARAM_FIELD_NUMBER: _ClassVar[int]
    num_classes: int
    background_label_id: int
    overlap_threshold: float
    evaluate_difficult_gt: bool
    name_size_file: str
    resize_param: ResizeParameter
    def __init__(self, num_classes: _Optional[int] = ..., background_label_id: _Optional[int] = ..., overlap_threshold: _Optional[float] = ..., evaluate_difficult_gt: _Optional[bool] = ..., name_size_file: _Optional[str] = ..., resize_param: _Optional[_Union[ResizeParameter, _Mapping]] = ...) -> None: ...

class NonMaximumSuppressionParameter(_message.Message):
    __slots__ = ("nms_threshold", "top_k", "eta")
    NMS_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    ETA_FIELD_NUMBER: _ClassVar[int]
    nms_threshold: float
    top_k: int
    eta: float
    def __init__(self, nms_threshold: _Optional[float] = ..., top_k: _Optional[int] = ..., eta: _Optional[float] = ...) -> None: ...

class SaveOutputParameter(_message.Message):
    __slots__ = ("output_directory", "output_name_prefix", "output_format", "label_map_file", "name_size_file", "num_test_image", "resize_param")
    OUTPUT_DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_NAME_PREFIX_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    LABEL_MAP_FILE_FIELD_NUMBER: _ClassVar[int]
    NAME_SIZE_FILE_FIELD_NUMBER: _ClassVar[int]
    NUM_TEST_IMAGE_FIELD_NUMBER: _ClassVar[int]
    RESIZE_PARAM_FIELD_NUMBER: _ClassVar[int]
    output_directory: str
    output_name_prefix: str
    output_format: str
    label_map_file: str
    name_size_file: str
    num_test_image: int
    resize_param: ResizeParameter
    def __init__(self, output_directory: _Optional[str] = ..., output_name_prefix: _Optional[str] = ..., output_format: _Optional[str] = ..., label_map_file: _Optional[str] = ..., name_size_file: _Optional[str] = ..., num_test_image: _Optional[int] = ..., resize_param: _Optional[_Union[ResizeParameter, _Mapping]] = ...) -> None: ...

class DetectionOutputParameter(_message.Message):
    __slots__ = ("num_classes", "share_location", "background_label_id", "nms_param", "save_output_param", "code_type", "variance_encoded_in_target", "keep_top_k", "confidence_threshold", "visualize", "visualize_threshold", "save_file", "thresholds")
    NUM_CLASSES_FIELD_NUMBER: _ClassVar[int]
    SHARE_LOCATION_FIELD_NUMBER: _ClassVar[int]
    BACKGROUND_LABEL_ID_FIELD_NUMBER: _ClassVar[int]
    NMS_PARAM_FIELD_NUMBER: _ClassVar[int]
    SAVE_OUTPUT_PARAM_FIELD_NUMBER: _ClassVar[int]
    CODE_TYPE_FIELD_NUMBER: _ClassVar[int]
    VARIANCE_ENCODED_IN_TARGET_FIELD_NUMBER: _ClassVar[int]
    KEEP_TOP_K_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    VISUALIZE_FIELD_NUMBER: _ClassVar[int]
    VISUALIZE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    SAVE_FILE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLDS_FIELD_NUMBER: _ClassVar[int]
    num_classes: int
    share_location: bool
    background_label_id: int
    nms_param: NonMaximumSuppressionParameter
    save_output_param: SaveOutputParameter
    code_type: PriorBoxParameter.CodeType
    variance_encoded_in_target: bool
    keep_top_k: int
    confidence_threshold: float
    visualize: bool
    visualize_threshold: float
    save_file: str
    thresholds: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, num_classes: _Optional[int] = ..., share_location: _Optional[bool] = ..., background_label_id: _Optional[int] = ..., nms_param: _Optional[_Union[NonMaximumSuppressionParameter, _Mapping]] = ..., save_output_param: _Optional[_Union[SaveOutputParameter, _Mapping]] = ..., code_type: _Optional[_Union[PriorBoxParameter.CodeType, str]] = ..., variance_encoded_in_target: _Optional[bool] = ..., keep_top_k: _Optional[int] = ..., confidence_threshold: _Optional[float] = ..., visualize: _Optional[bool] = ..., visualize_threshold: _Optional[float] = ..., save_file: _Optional[str] = ..., thresholds: _Optional[_Iterable[float]] = ...) -> None: ...

class DropoutParameter(_message.Message):
    __slots__ = ("dropout_ratio", "scale_train", "sample_weights_test")
    DROPOUT_RATIO_FIELD_NUMBER: _ClassVar[int]
    SCALE_TRAIN_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_WEIGHTS_TEST_FIELD_NUMBER: _ClassVar[int]
    dropout_ratio: float
    scale_train: bool
    sample_weights_test: bool
    def __init__(self, dropout_ratio: _Optional[float] = ..., scale_train: _Optional[bool] = ..., sample_weights_test: _Optional[bool] = ...) -> None: ...

class DummyDataParameter(_message.Message):
    __slots__ = ("data_filler", "shape", "num", "channels", "height", "width")
    DATA_FILLER_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NUM_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    data_filler: _containers.RepeatedCompositeFieldContainer[FillerParameter]
    shape: _containers.RepeatedCompositeFieldContainer[BlobShape]
    num: _containers.RepeatedScalarFieldContainer[int]
    channels: _containers.RepeatedScalarFieldContainer[int]
    height: _containers.RepeatedScalarFieldContainer[int]
    width: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, data_filler: _Optional[_Iterable[_Union[FillerParameter, _Mapping]]] = ..., shape: _Optional[_Iterable[_Union[BlobShape, _Mapping]]] = ..., num: _Optional[_Iterable[int]] = ..., channels: _Optional[_Iterable[int]] = ..., height: _Optional[_Iterable[int]] = ..., width: _Optional[_Iterable[int]] = ...) -> None: ...

class EltwiseParameter(_message.Message):
    __slots__ = ("operation", "coeff", "stable_prod_grad")
    class EltwiseOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        PROD: _ClassVar[EltwiseParameter.EltwiseOp]
        SUM: _ClassVar[EltwiseParameter.EltwiseOp]
        MAX: _ClassVar[EltwiseParameter.EltwiseOp]
    PROD: EltwiseParameter.EltwiseOp
    SUM: EltwiseParameter.EltwiseOp
    MAX: EltwiseParameter.EltwiseOp
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    COEFF_FIELD_NUMBER: _ClassVar[int]
    STABLE_PROD_GRAD_FIELD_NUMBER: _ClassVar[int]
    operation: EltwiseParameter.EltwiseOp
    coeff: _containers.RepeatedScalarFieldContainer[float]
    stable_prod_grad: bool
    def __init__(self, operation: _Optional[_Union[EltwiseParameter.EltwiseOp, str]] = ..., coeff: _Optional[_Iterable[float]] = ..., stable_prod_grad: _Optional[bool] = ...) -> None: ...

class ELUParameter(_message.Message):
    __slots__ = ("alpha",)
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    alpha: float
    def __init__(self, alpha: _Optional[float] = ...) -> None: ...

class EmbedParameter(_message.Message):
    __slots__ = ("num_output", "input_dim", "bias_term", "weight_filler", "bias_filler")
    NUM_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    INPUT_DIM_FIELD_NUMBER: _ClassVar[int]
    BIAS_TERM_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FILLER_FIELD_NUMBER: _ClassVar[int]
    BIAS_FILLER_FIELD_NUMBER: _ClassVar[int]
    num_output: int
    input_dim: int
    bias_term: bool
    weight_filler: FillerParameter
    bias_filler: FillerParameter
    def __init__(self, num_output: _Optional[int] = ..., input_dim: _Optional[int] = ..., bias_term: _Optional[bool] = ..., weight_filler: _Optional[_Union[FillerParameter, _Mapping]] = ..., bias_filler: _Optional[_Union[FillerParameter, _Mapping]] = ...) -> None: ...

class ExpParameter(_message.Message):
    __slots__ = ("base", "scale", "shift")
    BASE_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    SHIFT_FIELD_NUMBER: _ClassVar[int]
    base: float
    scale: float
    shift: float
    def __init__(self, base: _Optional[float] = ..., scale: _Optional[float] = ..., shift: _Optional[float] = ...) -> None: ...

class FlattenParameter(_message.Message):
    __slots__ = ("axis", "end_axis")
    AXIS_FIELD_NUMBER: _ClassVar[int]
    END_AXIS_FIELD_NUMBER: _ClassVar[int]
    axis: int
    end_axis: int
    def __init__(self, axis: _Optional[int] = ..., end_axis: _Optional[int] = ...) -> None: ...

class HDF5DataParameter(_message.Message):
    __slots__ = ("source", "batch_size", "shuffle")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_FIELD_NUMBER: _ClassVar[int]
    source: str
    batch_size: int
    shuffle: bool
    def __init__(self, source: _Optional[str] = ..., batch_size: _Optional[int] = ..., shuffle: _Optional[bool] = ...) -> None: ...

class HDF5OutputParameter(_message.Message):
    __slots__ = ("file_name",)
    FILE_NAME_FIELD_NUMBER: _ClassVar[int]
    file_name: str
    def __init__(self, file_name: _Optional[str] = ...) -> None: ...

class HingeLossParameter(_message.Message):
    __slots__ = ("norm",)
    class Norm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        L1: _ClassVar[HingeLossParameter.Norm]
        L2: _ClassVar[HingeLossParameter.Norm]
    L1: HingeLossParameter.Norm
    L2: HingeLossParameter.Norm
    NORM_FIELD_NUMBER: _ClassVar[int]
    norm: HingeLossParameter.Norm
    def __init__(self, norm: _Optional[_Union[HingeLossParameter.Norm, str]] = ...) -> None: ...

class ImageDataParameter(_message.Message):
    __slots__ = ("source", "batch_size", "rand_skip", "shuffle", "new_height", "new_width", "is_color", "scale", "mean_file", "crop_size", "mirror", "root_folder")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    RAND_SKIP_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_FIELD_NUMBER: _ClassVar[int]
    NEW_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    NEW_WIDTH_FIELD_NUMBER: _ClassVar[int]
    IS_COLOR_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    MEAN_FILE_FIELD_NUMBER: _ClassVar[int]
    CROP_SIZE_FIELD_NUMBER: _ClassVar[int]
    MIRROR_FIELD_NUMBER: _ClassVar[int]
    ROOT_FOLDER_FIELD_NUMBER: _ClassVar[int]
    source: str
    batch_size: int
    rand_skip: int
    shuffle: bool
    new_height: int
    new_width: int
    is_color: bool
    scale: float
    mean_file: str
    crop_size: int
    mirror: bool
    root_folder: str
    def __init__(self, source: _Optional[str] = ..., batch_size: _Optional[int] = ..., rand_skip: _Optional[int] = ..., shuffle: _Optional[bool] = ..., new_height: _Optional[int] = ..., new_width: _Optional[int] = ..., is_color: _Optional[bool] = ..., scale: _Optional[float] = ..., mean_file: _Optional[str] = ..., crop_size: _Optional[int] = ..., mirror: _Optional[bool] = ..., root_folder: _Optional[str] = ...) -> None: ...

class InfogainLossParameter(_message.Message):
    __slots__ = ("source", "axis")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    AXIS_FIELD_NUMBER: _ClassVar[int]
    source: str
    axis: int
    def __init__(self, source: _Optional[str] = ..., axis: _Optional[int] = ...) -> None: ...

class InnerProductParameter(_message.Message):
    __slots__ = ("num_output", "bias_term", "weight_filler", "bias_filler", "axis", "transpose")
    NUM_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    BIAS_TERM_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FILLER_FIELD_NUMBER: _ClassVar[int]
    BIAS_FILLER_FIELD_NUMBER: _ClassVar[int]
    AXIS_FIELD_NUMBER: _ClassVar[int]
    TRANSPOSE_FIELD_NUMBER: _ClassVar[int]
    num_output: int
    bias_term: bool
    weight_filler: FillerParameter
    bias_filler: FillerParameter
    axis: int
    transpose: bool
    def __init__(self, num_output: _Optional[int] = ..., bias_term: _Optional[bool] = ..., weight_filler: _Optional[_Union[FillerParameter, _Mapping]] = ..., bias_filler: _Optional[_Union[FillerParameter, _Mapping]] = ..., axis: _Optional[int] = ..., transpose: _Optional[bool] = ...) -> None: ...

class InputParameter(_message.Message):
    __slots__ = ("shape",)
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedCompositeFieldContainer[BlobShape]
    def __init__(self, shape: _Optional[_Iterable[_Union[BlobShape, _Mapping]]] = ...) -> None: ...

class LogParameter(_message.Message):
    __slots__ = ("base", "scale", "shift")
    BASE_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    SHIFT_FIELD_NUMBER: _ClassVar[int]
    base: float
    scale: float
    shift: float
    def __init__(self, base: _Optional[float] = ..., scale: _Optional[float] = ..., shift: _Optional[float] = ...) -> None: ...

class LRNParameter(_message.Message):
    __slots__ = ("local_size", "alpha", "beta", "norm_region", "k", "engine")
    class NormRegion(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ACROSS_CHANNELS: _ClassVar[LRNParameter.NormRegion]
        WITHIN_CHANNEL: _ClassVar[LRNParameter.NormRegion]
    ACROSS_CHANNELS: LRNParameter.NormRegion
    WITHIN_CHANNEL: LRNParameter.NormRegion
    class Engine(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        DEFAULT: _ClassVar[LRNParameter.Engine]
        CAFFE: _ClassVar[LRNParameter.Engine]
        CUDNN: _ClassVar[LRNParameter.Engine]
    DEFAULT: LRNParameter.Engine
    CAFFE: LRNParameter.Engine
    CUDNN: LRNParameter.Engine
    LOCAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    NORM_REGION_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    local_size: int
    alpha: float
    beta: float
    norm_region: LRNParameter.NormRegion
    k: float
    engine: LRNParameter.Engine
    def __init__(self, local_size: _Optional[int] = ..., alpha: _Optional[float] = ..., beta: _Optional[float] = ..., norm_region: _Optional[_Union[LRNParameter.NormRegion, str]] = ..., k: _Optional[float] = ..., engine: _Optional[_Union[LRNParameter.Engine, str]] = ...) -> None: ...

class MemoryDataParameter(_message.Message):
    __slots__ = ("batch_size", "channels", "height", "width")
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    channels: int
    height: int
    width: int
    def __init__(self, batch_size: _Optional[int] = ..., channels: _Optional[int] = ..., height: _Optional[int] = ..., width: _Optional[int] = ...) -> None: ...

class MultiBoxLossParameter(_message.Message):
    __slots__ = ("loc_loss_type", "conf_loss_type", "loc_weight", "num_classes", "share_location", "match_type", "overlap_threshold", "use_prior_for_matching", "background_label_id", "use_difficult_gt", "do_neg_mining", "neg_pos_ratio", "neg_overlap", "code_type", "encode_variance_in_target", "map_object_to_agnostic", "ignore_cross_boundary_bbox", "bp_inside", "mining_type", "nms_param", "sample_size", "use_prior_for_nms")
    class LocLossType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        L2: _ClassVar[MultiBoxLossParameter.LocLossType]
        SMOOTH_L1: _ClassVar[MultiBoxLossParameter.LocLossType]
    L2: MultiBoxLossParameter.LocLossType
    SMOOTH_L1: MultiBoxLossParameter.LocLossType
    class ConfLossType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SOFTMAX: _ClassVar[MultiBoxLossParameter.ConfLossType]
        LOGISTIC: _ClassVar[MultiBoxLossParameter.ConfLossType]
    SOFTMAX: MultiBoxLossParameter.ConfLossType
    LOGISTIC: MultiBoxLossParameter.ConfLossType
    class MatchType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        BIPARTITE: _ClassVar[MultiBoxLossParameter.MatchType]
        PER_PREDICTION: _ClassVar[MultiBoxLossParameter.MatchType]
    BIPARTITE: MultiBoxLossParameter.MatchType
    PER_PREDICTION: MultiBoxLossParameter.MatchType
    class MiningType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        NONE: _ClassVar[MultiBoxLossParameter.MiningType]
        MAX_NEGATIVE: _ClassVar[MultiBoxLossParameter.MiningType]
        HARD_EXAMPLE: _ClassVar[MultiBoxLossParameter.MiningType]
    NONE: MultiBoxLossParameter.MiningType
    MAX_NEGATIVE: MultiBoxLossParameter.MiningType
    HARD_EXAMPLE: MultiBoxLossParameter.MiningType
    LOC_LOSS_TYPE_FIELD_NUMBER: _ClassVar[int]
    CONF_LOSS_TYPE_FIELD_NUMBER: _ClassVar[int]
    LOC_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    NUM_CLASSES_FIELD_NUMBER: _ClassVar[int]
    SHARE_LOCATION_FIELD_NUMBER: _ClassVar[int]
    MATCH_TYPE_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    USE_PRIOR_FOR_MATCHING_FIELD_NUMBER: _ClassVar[int]
    BACKGROUND_LABEL_ID_FIELD_NUMBER: _ClassVar[int]
    USE_DIFFICULT_GT_FIELD_NUMBER: _ClassVar[int]
    DO_NEG_MINING_FIELD_NUMBER: _ClassVar[int]
    NEG_POS_RATIO_FIELD_NUMBER: _ClassVar[int]
    NEG_OVERLAP_FIELD_NUMBER: _ClassVar[int]
    CODE_TYPE_FIELD_NUMBER: _ClassVar[int]
    ENCODE_VARIANCE_IN_TARGET_FIELD_NUMBER: _ClassVar[int]
    MAP_OBJECT_TO_AGNOSTIC_FIELD_NUMBER: _ClassVar[int]
    IGNORE_CROSS_BOUNDARY_BBOX_FIELD_NUMBER: _ClassVar[int]
    BP_INSIDE_FIELD_NUMBER: _ClassVar[int]
    MINING_TYPE_FIELD_NUMBER: _ClassVar[int]
    NMS_PARAM_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    USE_PRIOR_FOR_NMS_FIELD_NUMBER: _ClassVar[int]
    loc_loss_type: MultiBoxLossParameter.LocLossType
    conf_loss_type: MultiBoxLossParameter.ConfLossType
    loc_weight: float
    num_classes: int
    share_location: bool
    match_type: MultiBoxLossParameter.MatchType
    overlap_threshold: float
    use_prior_for_matching: bool
    background_label_id: int
    use_difficult_gt: bool
    do_neg_mining: bool
    neg_pos_ratio: float
    neg_overlap: float
    code_type: PriorBoxParameter.CodeType
    encode_variance_in_target: bool
    map_object_to_agnostic: bool
    ignore_cross_boundary_bbox: bool
    bp_inside: bool
    mining_type: MultiBoxLossParameter.MiningType
    nms_param: NonMaximumSuppressionParameter
    sample_size: int
    use_prior_for_nms: bool
    def __init__(self, loc_loss_type: _Optional[_Union[MultiBoxLossParameter.LocLossType, str]] = ..., conf_loss_type: _Optional[_Union[MultiBoxLossParameter.ConfLossType, str]] = ..., loc_weight: _Optional[float] = ..., num_classes: _Optional[int] = ..., share_location: _Optional[bool] = ..., match_type: _Optional[_Union[MultiBoxLossParameter.MatchType, str]] = ..., overlap_threshold: _Optional[float] = ..., use_prior_for_matching: _Optional[bool] = ..., background_label_id: _Optional[int] = ..., use_difficult_gt: _Optional[bool] = ..., do_neg_mining: _Optional[bool] = ..., neg_pos_ratio: _Optional[float] = ..., neg_overlap: _Optional[float] = ..., code_type: _Optional[_Union[PriorBoxParameter.CodeType, str]] = ..., encode_variance_in_target: _Optional[bool] = ..., map_object_to_agnostic: _Optional[bool] = ..., ignore_cross_boundary_bbox: _Optional[bool] = ..., bp_inside: _Optional[bool] = ..., mining_type: _Optional[_Union[MultiBoxLossParameter.MiningType, str]] = ..., nms_param: _Optional[_Union[NonMaximumSuppressionParameter, _Mapping]] = ..., sample_size: _Optional[int] = ..., use_prior_for_nms: _Optional[bool] = ...) -> None: ...

class MVNParameter(_message.Message):
    __slots__ = ("normalize_variance", "across_channels", "eps")
    NORMALIZE_VARIANCE_FIELD_NUMBER: _ClassVar[int]
    ACROSS_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    normalize_variance: bool
    across_channels: bool
    eps: float
    def __init__(self, normalize_variance: _Optional[bool] = ..., across_channels: _Optional[bool] = ..., eps: _Optional[float] = ...) -> None: ...

class NormalizeParameter(_message.Message):
    __slots__ = ("across_spatial", "scale_filler", "channel_shared", "eps")
    ACROSS_SPATIAL_FIELD_NUMBER: _ClassVar[int]
    SCALE_FILLER_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_SHARED_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    across_spatial: bool
    scale_filler: FillerParameter
    channel_shared: bool
    eps: float
    def __init__(self, across_spatial: _Optional[bool] = ..., scale_filler: _Optional[_Union[FillerParameter, _Mapping]] = ..., channel_shared: _Optional[bool] = ..., eps: _Optional[float] = ...) -> None: ...

class ParameterParameter(_message.Message):
    __slots__ = ("shape",)
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    shape: BlobShape
    def __init__(self, shape: _Optional[_Union[BlobShape, _Mapping]] = ...) -> None: ...

class PermuteParameter(_message.Message):
    __slots__ = ("order",)
    ORDER_FIELD_NUMBER: _ClassVar[int]
    order: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, order: _Optional[_Iterable[int]] = ...) -> None: ...

class PoolingParameter(_message.Message):
    __slots__ = ("pool", "pad", "pad_h", "pad_w", "kernel_size", "kernel_h", "kernel_w", "stride", "stride_h", "stride_w", "engine", "global_pooling", "round_mode", "ceil_mode")
    class PoolMethod(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        MAX: _ClassVar[PoolingParameter.PoolMethod]
        AVE: _ClassVar[PoolingParameter.PoolMethod]
        STOCHASTIC: _ClassVar[PoolingParameter.PoolMethod]
    MAX: PoolingParameter.PoolMethod
    AVE: PoolingParameter.PoolMethod
    STOCHASTIC: PoolingParameter.PoolMethod
    class Engine(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        DEFAULT: _ClassVar[PoolingParameter.Engine]
        CAFFE: _ClassVar[PoolingParameter.Engine]
        CUDNN: _ClassVar[PoolingParameter.Engine]
    DEFAULT: PoolingParameter.Engine
    CAFFE: PoolingParameter.Engine
    CUDNN: PoolingParameter.Engine
    class RoundMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        CEIL: _ClassVar[PoolingParameter.RoundMode]
        FLOOR: _ClassVar[PoolingParameter.RoundMode]
    CEIL: PoolingParameter.RoundMode
    FLOOR: PoolingParameter.RoundMode
    POOL_FIELD_NUMBER: _ClassVar[int]
    PAD_FIELD_NUMBER: _ClassVar[int]
    PAD_H_FIELD_NUMBER: _ClassVar[int]
    PAD_W_FIELD_NUMBER: _ClassVar[int]
    KERNEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    KERNEL_H_FIELD_NUMBER: _ClassVar[int]
    KERNEL_W_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    STRIDE_H_FIELD_NUMBER: _ClassVar[int]
    STRIDE_W_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_POOLING_FIELD_NUMBER: _ClassVar[int]
    ROUND_MODE_FIELD_NUMBER: _ClassVar[int]
    CEIL_MODE_FIELD_NUMBER: _ClassVar[int]
    pool: PoolingParameter.PoolMethod
    pad: int
    pad_h: int
    pad_w: int
    kernel_size: int
    kernel_h: int
    kernel_w: int
    stride: int
    stride_h: int
    stride_w: int
    engine: PoolingParameter.Engine
    global_pooling: bool
    round_mode: PoolingParameter.RoundMode
    ceil_mode: bool
    def __init__(self, pool: _Optional[_Union[PoolingParameter.PoolMethod, str]] = ..., pad: _Optional[int] = ..., pad_h: _Optional[int] = ..., pad_w: _Optional[int] = ..., kernel_size: _Optional[int] = ..., kernel_h: _Optional[int] = ..., kernel_w: _Optional[int] = ..., stride: _Optional[int] = ..., stride_h: _Optional[int] = ..., stride_w: _Optional[int] = ..., engine: _Optional[_Union[PoolingParameter.Engine, str]] = ..., global_pooling: _Optional[bool] = ..., round_mode: _Optional[_Union[PoolingParameter.RoundMode, str]] = ..., ceil_mode: _Optional[bool] = ...) -> None: ...

class PowerParameter(_message.Message):
    __slots__ = ("power", "scale", "shift")
    POWER_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    SHIFT_FIELD_NUMBER: _ClassVar[int]
    power: float
    scale: float
    shift: float
    def __init__(self, power: _Optional[float] = ..., scale: _Optional[float] = ..., shift: _Optional[float] = ...) -> None: ...

class PriorBoxParameter(_message.Message):
    __slots__ = ("min_size", "max_size", "aspect_ratio", "flip", "clip", "variance", "img_size", "img_h", "img_w", "step", "step_h", "step_w", "offset")
    class CodeType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        CORNER: _ClassVar[PriorBoxParameter.CodeType]
        CENTER_SIZE: _ClassVar[PriorBoxParameter.CodeType]
        CORNER_SIZE: _ClassVar[PriorBoxParameter.CodeType]
    CORNER: PriorBoxParameter.CodeType
    CENTER_SIZE: PriorBoxParameter.CodeType
    CORNER_SIZE: PriorBoxParameter.CodeType
    MIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_SIZE_FIELD_NUMBER: _ClassVar[int]
    ASPECT_RATIO_FIELD_NUMBER: _ClassVar[int]
    FLIP_FIELD_NUMBER: _ClassVar[int]
    CLIP_FIELD_NUMBER: _ClassVar[int]
    VARIANCE_FIELD_NUMBER: _ClassVar[int]
    IMG_SIZE_FIELD_NUMBER: _ClassVar[int]
    IMG_H_FIELD_NUMBER: _ClassVar[int]
    IMG_W_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEP_H_FIELD_NUMBER: _ClassVar[int]
    STEP_W_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    min_size: _containers.RepeatedScalarFieldContainer[float]
    max_size: _containers.RepeatedScalarFieldContainer[float]
    aspect_ratio: _containers.RepeatedScalarFieldContainer[float]
    flip: bool
    clip: bool
    variance: _containers.RepeatedScalarFieldContainer[float]
    img_size: int
    img_h: int
    img_w: int
    step: float
    step_h: float
    step_w: float
    offset: float
    def __init__(self, min_size: _Optional[_Iterable[float]] = ..., max_size: _Optional[_Iterable[float]] = ..., aspect_ratio: _Optional[_Iterable[float]] = ..., flip: _Optional[bool] = ..., clip: _Optional[bool] = ..., variance: _Optional[_Iterable[float]] = ..., img_size: _Optional[int] = ..., img_h: _Optional[int] = ..., img_w: _Optional[int] = ..., step: _Optional[float] = ..., step_h: _Optional[float] = ..., step_w: _Optional[float] = ..., offset: _Optional[float] = ...) -> None: ...

class PythonParameter(_message.Message):
    __slots__ = ("module", "layer", "param_str", "share_in_parallel")
    MODULE_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    PARAM_STR_FIELD_NUMBER: _ClassVar[int]
    SHARE_IN_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    module: str
    layer: str
    param_str: str
    share_in_parallel: bool
    def __init__(self, module: _Optional[str] = ..., layer: _Optional[str] = ..., param_str: _Optional[str] = ..., share_in_parallel: _Optional[bool] = ...) -> None: ...

class RecurrentParameter(_message.Message):
    __slots__ = ("num_output", "weight_filler", "bias_filler", "debug_info", "expose_hidden")
    NUM_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FILLER_FIELD_NUMBER: _ClassVar[int]
    BIAS_FILLER_FIELD_NUMBER: _ClassVar[int]
    DEBUG_INFO_FIELD_NUMBER: _ClassVar[int]
    EXPOSE_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    num_output: int
    weight_filler: FillerParameter
    bias_filler: FillerParameter
    debug_info: bool
    expose_hidden: bool
    def __init__(self, num_output: _Optional[int] = ..., weight_filler: _Optional[_Union[FillerParameter, _Mapping]] = ..., bias_filler: _Optional[_Union[FillerParameter, _Mapping]] = ..., debug_info: _Optional[bool] = ..., expose_hidden: _Optional[bool] = ...) -> None: ...

class ReductionParameter(_message.Message):
    __slots__ = ("operation", "axis", "coeff")
    class ReductionOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SUM: _ClassVar[ReductionParameter.ReductionOp]
        ASUM: _ClassVar[ReductionParameter.ReductionOp]
        SUMSQ: _ClassVar[ReductionParameter.ReductionOp]
        MEAN: _ClassVar[ReductionParameter.ReductionOp]
    SUM: ReductionParameter.ReductionOp
    ASUM: ReductionParameter.ReductionOp
    SUMSQ: ReductionParameter.ReductionOp
    MEAN: ReductionParameter.ReductionOp
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    AXIS_FIELD_NUMBER: _ClassVar[int]
    COEFF_FIELD_NUMBER: _ClassVar[int]
    operation: ReductionParameter.ReductionOp
    axis: int
    coeff: float
    def __init__(self, operation: _Optional[_Union[ReductionParameter.ReductionOp, str]] = ..., axis: _Optional[int] = ..., coeff: _Optional[float] = ...) -> None: ...

class ReLUParameter(_message.Message):
    __slots__ = ("negative_slope", "engine")
    class Engine(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        DEFAULT: _ClassVar[ReLUParameter.Engine]
        CAFFE: _ClassVar[ReLUParameter.Engine]
        CUDNN: _ClassVar[ReLUParameter.Engine]
    DEFAULT: ReLUParameter.Engine
    CAFFE: ReLUParameter.Engine
    CUDNN: ReLUParameter.Engine
    NEGATIVE_SLOPE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    negative_slope: float
    engine: ReLUParameter.Engine
    def __init__(self, negative_slope: _Optional[float] = ..., engine: _Optional[_Union[ReLUParameter.Engine, str]] = ...) -> None: ...

class ReshapeParameter(_message.Message):
    __slots__ = ("shape", "axis", "num_axes")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    AXIS_FIELD_NUMBER: _ClassVar[int]
    NUM_AXES_FIELD_NUMBER: _ClassVar[int]
    shape: BlobShape
    axis: int
    num_axes: int
    def __init__(self, shape: _Optional[_Union[BlobShape, _Mapping]] = ..., axis: _Optional[int] = ..., num_axes: _Optional[int] = ...) -> None: ...

class ScaleParameter(_message.Message):
    __slots__ = ("axis", "num_axes", "filler", "bias_term", "bias_filler")
    AXIS_FIELD_NUMBER: _ClassVar[int]
    NUM_AXES_FIELD_NUMBER: _ClassVar[int]
    FILLER_FIELD_NUMBER: _ClassVar[int]
    BIAS_TERM_FIELD_NUMBER: _ClassVar[int]
    BIAS_FILLER_FIELD_NUMBER: _ClassVar[int]
    axis: int
    num_axes: int
    filler: FillerParameter
    bias_term: bool
    bias_filler: FillerParameter
    def __init__(self, axis: _Optional[int] = ..., num_axes: _Optional[int] = ..., filler: _Optional[_Union[FillerParameter, _Mapping]] = ..., bias_term: _Optional[bool] = ..., bias_filler: _Optional[_Union[FillerParameter, _Mapping]] = ...) -> None: ...

class SigmoidParameter(_message.Message):
    __slots__ = ("engine",)
    class Engine(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        DEFAULT: _ClassVar[SigmoidParameter.Engine]
        CAFFE: _ClassVar[SigmoidParameter.Engine]
        CUDNN: _ClassVar[SigmoidParameter.Engine]
    DEFAULT: SigmoidParameter.Engine
    CAFFE: SigmoidParameter.Engine
    CUDNN: SigmoidParameter.Engine
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    engine: SigmoidParameter.Engine
    def __init__(self, engine: _Optional[_Union[SigmoidParameter.Engine, str]] = ...) -> None: ...

class SliceParameter(_message.Message):
    __slots__ = ("axis", "slice_point", "slice_dim")
    AXIS_FIELD_NUMBER: _ClassVar[int]
    SLICE_POINT_FIELD_NUMBER: _ClassVar[int]
    SLICE_DIM_FIELD_NUMBER: _ClassVar[int]
    axis: int
    slice_point: _containers.RepeatedScalarFieldContainer[int]
    slice_dim: int
    def __init__(self, axis: _Optional[int] = ..., slice_point: _Optional[_Iterable[int]] = ..., slice_dim: _Optional[int] = ...) -> None: ...

class SoftmaxParameter(_message.Message):
    __slots__ = ("engine", "axis")
    class Engine(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        DEFAULT: _ClassVar[SoftmaxParameter.Engine]
        CAFFE: _ClassVar[SoftmaxParameter.Engine]
        CUDNN: _ClassVar[SoftmaxParameter.Engine]
    DEFAULT: SoftmaxParameter.Engine
    CAFFE: SoftmaxParameter.Engine
    CUDNN: SoftmaxParameter.Engine
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    AXIS_FIELD_NUMBER: _ClassVar[int]
    engine: SoftmaxParameter.Engine
    axis: int
    def __init__(self, engine: _Optional[_Union[SoftmaxParameter.Engine, str]] = ..., axis: _Optional[int] = ...) -> None: ...

class SwishParameter(_message.Message):
    __slots__ = ("beta",)
    BETA_FIELD_NUMBER: _ClassVar[int]
    beta: float
    def __init__(self, beta: _Optional[float] = ...) -> None: ...

class TanHParameter(_message.Message):
    __slots__ = ("engine",)
    class Engine(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        DEFAULT: _ClassVar[TanHParameter.Engine]
        CAFFE: _ClassVar[TanHParameter.Engine]
        CUDNN: _ClassVar[TanHParameter.Engine]
    DEFAULT: TanHParameter.Engine
    CAFFE: TanHParameter.Engine
    CUDNN: TanHParameter.Engine
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    engine: TanHParameter.Engine
    def __init__(self, engine: _Optional[_Union[TanHParameter.Engine, str]] = ...) -> None: ...

class TileParameter(_message.Message):
    __slots__ = ("axis", "tiles")
    AXIS_FIELD_NUMBER: _ClassVar[int]
    TILES_FIELD_NUMBER: _ClassVar[int]
    axis: int
    tiles: int
    def __init__(self, axis: _Optional[int] = ..., tiles: _Optional[int] = ...) -> None: ...

class ThresholdParameter(_message.Message):
    __slots__ = ("threshold",)
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    threshold: float
    def __init__(self, threshold: _Optional[float] = ...) -> None: ...

class VideoDataParameter(_message.Message):
    __slots__ = ("video_type", "device_id", "video_file", "skip_frames")
    class VideoType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        WEBCAM: _ClassVar[VideoDataParameter.VideoType]
        VIDEO: _ClassVar[VideoDataParameter.VideoType]
    WEBCAM: VideoDataParameter.VideoType
    VIDEO: VideoDataParameter.VideoType
    VIDEO_TYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    VIDEO_FILE_FIELD_NUMBER: _ClassVar[int]
    SKIP_FRAMES_FIELD_NUMBER: _ClassVar[int]
    video_type: VideoDataParameter.VideoType
    device_id: int
    video_file: str
    skip_frames: int
    def __init__(self, video_type: _Optional[_Union[VideoDataParameter.VideoType, str]] = ..., device_id: _Optional[int] = ..., video_file: _Optional[str] = ..., skip_frames: _Optional[int] = ...) -> None: ...

class WindowDataParameter(_message.Message):
    __slots__ = ("source", "scale", "mean_file", "batch_size", "crop_size", "mirror", "fg_threshold", "bg_threshold", "fg_fraction", "context_pad", "crop_mode", "cache_images", "root_folder")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    MEAN_FILE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    CROP_SIZE_FIELD_NUMBER: _ClassVar[int]
    MIRROR_FIELD_NUMBER: _ClassVar[int]
    FG_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    BG_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    FG_FRACTION_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_PAD_FIELD_NUMBER: _ClassVar[int]
    CROP_MODE_FIELD_NUMBER: _ClassVar[int]
    CACHE_IMAGES_FIELD_NUMBER: _ClassVar[int]
    ROOT_FOLDER_FIELD_NUMBER: _ClassVar[int]
    source: str
    scale: float
    mean_file: str
    batch_size: int
    crop_size: int
    mirror: bool
    fg_threshold: float
    bg_threshold: float
    fg_fraction: float
    context_pad: int
    crop_mode: str
    cache_images: bool
    root_folder: str
    def __init__(self, source: _Optional[str] = ..., scale: _Optional[float] = ..., mean_file: _Optional[str] = ..., batch_size: _Optional[int] = ..., crop_size: _Optional[int] = ..., mirror: _Optional[bool] = ..., fg_threshold: _Optional[float] = ..., bg_threshold: _Optional[float] = ..., fg_fraction: _Optional[float] = ..., context_pad: _Optional[int] = ..., crop_mode: _Optional[str] = ..., cache_images: _Optional[bool] = ..., root_folder: _Optional[str] = ...) -> None: ...

class SPPParameter(_message.Message):
    __slots__ = ("pyramid_height", "pool", "engine")
    class PoolMethod(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        MAX: _ClassVar[SPPParameter.PoolMethod]
        AVE: _ClassVar[SPPParameter.PoolMethod]
        STOCHASTIC: _ClassVar[SPPParameter.PoolMethod]
    MAX: SPPParameter.PoolMethod
    AVE: SPPParameter.PoolMethod
    STOCHASTIC: SPPParameter.PoolMethod
    class Engine(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        DEFAULT: _ClassVar[SPPParameter.Engine]
        CAFFE: _ClassVar[SPPParameter.Engine]
        CUDNN: _ClassVar[SPPParameter.Engine]
    DEFAULT: SPPParameter.Engine
    CAFFE: SPPParameter.Engine
    CUDNN: SPPParameter.Engine
    PYRAMID_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    pyramid_height: int
    pool: SPPParameter.PoolMethod
    engine: SPPParameter.Engine
    def __init__(self, pyramid_height: _Optional[int] = ..., pool: _Optional[_Union[SPPParameter.PoolMethod, str]] = ..., engine: _Optional[_Union[SPPParameter.Engine, str]] = ...) -> None: ...

class V1LayerParameter(_message.Message):
    __slots__ = ("bottom", "top", "name", "include", "exclude", "type", "blobs", "param", "blob_share_mode", "blobs_lr", "weight_decay", "loss_weight", "accuracy_param", "argmax_param", "concat_param", "contrastive_loss_param", "convolution_param", "data_param", "dropout_param", "dummy_data_param", "eltwise_param", "exp_param", "hdf5_data_param", "hdf5_output_param", "hinge_loss_param", "image_data_param", "infogain_loss_param", "inner_product_param", "lrn_param", "memory_data_param", "mvn_param", "pooling_param", "power_param", "relu_param", "sigmoid_param", "softmax_param", "slice_param", "tanh_param", "threshold_param", "window_data_param", "transform_param", "loss_param", "layer", "bn_param", "batch_norm_param")
    class LayerType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        NONE: _ClassVar[V1LayerParameter.LayerType]
        ABSVAL: _ClassVar[V1LayerParameter.LayerType]
        ACCURACY: _ClassVar[V1LayerParameter.LayerType]
        ARGMAX: _ClassVar[V1LayerParameter.LayerType]
        BNLL: _ClassVar[V1LayerParameter.LayerType]
        CONCAT: _ClassVar[V1LayerParameter.LayerType]
        CONTRASTIVE_LOSS: _ClassVar[V1LayerParameter.LayerType]
        CONVOLUTION: _ClassVar[V1LayerParameter.LayerType]
        DATA: _ClassVar[V1LayerParameter.LayerType]
        DECONVOLUTION: _ClassVar[V1LayerParameter.LayerType]
        DROPOUT: _ClassVar[V1LayerParameter.LayerType]
        DUMMY_DATA: _ClassVar[V1LayerParameter.LayerType]
        EUCLIDEAN_LOSS: _ClassVar[V1LayerParameter.LayerType]
        ELTWISE: _ClassVar[V1LayerParameter.LayerType]
        EXP: _ClassVar[V1LayerParameter.LayerType]
        FLATTEN: _ClassVar[V1LayerParameter.LayerType]
        HDF5_DATA: _ClassVar[V1LayerParameter.LayerType]
        HDF5_OUTPUT: _ClassVar[V1LayerParameter.LayerType]
        HINGE_LOSS: _ClassVar[V1LayerParameter.LayerType]
        IM2COL: _ClassVar[V1LayerParameter.LayerType]
        IMAGE_DATA: _ClassVar[V1LayerParameter.LayerType]
        INFOGAIN_LOSS: _ClassVar[V1LayerParameter.LayerType]
        INNER_PRODUCT: _ClassVar[V1LayerParameter.LayerType]
        LRN: _ClassVar[V1LayerParameter.LayerType]
        MEMORY_DATA: _ClassVar[V1LayerParameter.LayerType]
        MULTINOMIAL_LOGISTIC_LOSS: _ClassVar[V1LayerParameter.LayerType]
        MVN: _ClassVar[V1LayerParameter.LayerType]
        POOLING: _ClassVar[V1LayerParameter.LayerType]
        POWER: _ClassVar[V1LayerParameter.LayerType]
        RELU: _ClassVar[V1LayerParameter.LayerType]
        SIGMOID: _ClassVar[V1LayerParameter.LayerType]
        SIGMOID_CROSS_ENTROPY_LOSS: _ClassVar[V1LayerParameter.LayerType]
        SILENCE: _ClassVar[V1LayerParameter.LayerType]
        SOFTMAX: _ClassVar[V1LayerParameter.LayerType]
        SOFTMAX_LOSS: _ClassVar[V1LayerParameter.LayerType]
        SPLIT: _ClassVar[V1LayerParameter.LayerType]
        SLICE: _ClassVar[V1LayerParameter.LayerType]
        TANH: _ClassVar[V1LayerParameter.LayerType]
        WINDOW_DATA: _ClassVar[V1LayerParameter.LayerType]
        THRESHOLD: _ClassVar[V1LayerParameter.LayerType]
    NONE: V1LayerParameter.LayerType
    ABSVAL: V1LayerParameter.LayerType
    ACCURACY: V1LayerParameter.LayerType
    ARGMAX: V1LayerParameter.LayerType
    BNLL: V1LayerParameter.LayerType
    CONCAT: V1LayerParameter.LayerType
    CONTRASTIVE_LOSS: V1LayerParameter.LayerType
    CONVOLUTION: V1LayerParameter.LayerType
    DATA: V1LayerParameter.LayerType
    DECONVOLUTION: V1LayerParameter.LayerType
    DROPOUT: V1LayerParameter.LayerType
    DUMMY_DATA: V1LayerParameter.LayerType
    EUCLIDEAN_LOSS: V1LayerParameter.LayerType
    ELTWISE: V1LayerParameter.LayerType
    EXP: V1LayerParameter.LayerType
    FLATTEN: V1LayerParameter.LayerType
    HDF5_DATA: V1LayerParameter.LayerType
    HDF5_OUTPUT: V1LayerParameter.LayerType
    HINGE_LOSS: V1LayerParameter.LayerType
    IM2COL: V1LayerParameter.LayerType
    IMAGE_DATA: V1LayerParameter.LayerType
    INFOGAIN_LOSS: V1LayerParameter.LayerType
    INNER_PRODUCT: V1LayerParameter.LayerType
    LRN: V1LayerParameter.LayerType
    MEMORY_DATA: V1LayerParameter.LayerType
    MULTINOMIAL_LOGISTIC_LOSS: V1LayerParameter.LayerType
    MVN: V1LayerParameter.LayerType
    POOLING: V1LayerParameter.LayerType
    POWER: V1LayerParameter.LayerType
    RELU: V1LayerParameter.LayerType
    SIGMOID: V1LayerParameter.LayerType
    SIGMOID_CROSS_ENTROPY_LOSS: V1LayerParameter.LayerType
    SILENCE: V1LayerParameter.LayerType
    SOFTMAX: V1LayerParameter.LayerType
    SOFTMAX_LOSS: V1LayerParameter.LayerType
    SPLIT: V1LayerParameter.LayerType
    SLICE: V1LayerParameter.LayerType
    TANH: V1LayerParameter.LayerType
    WINDOW_DATA: V1LayerParameter.LayerType
    THRESHOLD: V1LayerParameter.LayerType
    class DimCheckMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STRICT: _ClassVar[V1LayerParameter.DimCheckMode]
        PERMISSIVE: _ClassVar[V1LayerParameter.DimCheckMode]
    STRICT: V1LayerParameter.DimCheckMode
    PERMISSIVE: V1LayerParameter.DimCheckMode
    BOTTOM_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    BLOBS_FIELD_NUMBER: _ClassVar[int]
    PARAM_FIELD_NUMBER: _ClassVar[int]
    BLOB_SHARE_MODE_FIELD_NUMBER: _ClassVar[int]
    BLOBS_LR_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    LOSS_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_PARAM_FIELD_NUMBER: _ClassVar[int]
    ARGMAX_PARAM_FIELD_NUMBER: _ClassVar[int]
    CONCAT_PARAM_FIELD_NUMBER: _ClassVar[int]
    CONTRASTIVE_LOSS_PARAM_FIELD_NUMBER: _ClassVar[int]
    CONVOLUTION_PARAM_FIELD_NUMBER: _ClassVar[int]
    DATA_PARAM_FIELD_NUMBER: _ClassVar[int]
    DROPOUT_PARAM_FIELD_NUMBER: _ClassVar[int]
    DUMMY_DATA_PARAM_FIELD_NUMBER: _ClassVar[int]
    ELTWISE_PARAM_FIELD_NUMBER: _ClassVar[int]
    EXP_PARAM_FIELD_NUMBER: _ClassVar[int]
    HDF5_DATA_PARAM_FIELD_NUMBER: _ClassVar[int]
    HDF5_OUTPUT_PARAM_FIELD_NUMBER: _ClassVar[int]
    HINGE_LOSS_PARAM_FIELD_NUMBER: _ClassVar[int]
    IMAGE_DATA_PARAM_FIELD_NUMBER: _ClassVar[int]
    INFOGAIN_LOSS_PARAM_FIELD_NUMBER: _ClassVar[int]
    INNER_PRODUCT_PARAM_FIELD_NUMBER: _ClassVar[int]
    LRN_PARAM_FIELD_NUMBER: _ClassVar[int]
    MEMORY_DATA_PARAM_FIELD_NUMBER: _ClassVar[int]
    MVN_PARAM_FIELD_NUMBER: _ClassVar[int]
    POOLING_PARAM_FIELD_NUMBER: _ClassVar[int]
    POWER_PARAM_FIELD_NUMBER: _ClassVar[int]
    RELU_PARAM_FIELD_NUMBER: _ClassVar[int]
    SIGMOID_PARAM_FIELD_NUMBER: _ClassVar[int]
    SOFTMAX_PARAM_FIELD_NUMBER: _ClassVar[int]
    SLICE_PARAM_FIELD_NUMBER: _ClassVar[int]
    TANH_PARAM_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_PARAM_FIELD_NUMBER: _ClassVar[int]
    WINDOW_DATA_PARAM_FIELD_NUMBER: _ClassVar[int]
    TRANSFORM_PARAM_FIELD_NUMBER: _ClassVar[int]
    LOSS_PARAM_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    BN_PARAM_FIELD_NUMBER: _ClassVar[int]
    BATCH_NORM_PARAM_FIELD_NUMBER: _ClassVar[int]
    bottom: _containers.RepeatedScalarFieldContainer[str]
    top: _containers.RepeatedScalarFieldContainer[str]
    name: str
    include: _containers.RepeatedCompositeFieldContainer[NetStateRule]
    exclude: _containers.RepeatedCompositeFieldContainer[NetStateRule]
    type: V1LayerParameter.LayerType
    blobs: _containers.RepeatedCompositeFieldContainer[BlobProto]
    param: _containers.RepeatedScalarFieldContainer[str]
    blob_share_mode: _containers.RepeatedScalarFieldContainer[V1LayerParameter.DimCheckMode]
    blobs_lr: _containers.RepeatedScalarFieldContainer[float]
    weight_decay: _containers.RepeatedScalarFieldContainer[float]
    loss_weight: _containers.RepeatedScalarFieldContainer[float]
    accuracy_param: AccuracyParameter
    argmax_param: ArgMaxParameter
    concat_param: ConcatParameter
    contrastive_loss_param: ContrastiveLossParameter
    convolution_param: ConvolutionParameter
    data_param: DataParameter
    dropout_param: DropoutParameter
    dummy_data_param: DummyDataParameter
    eltwise_param: EltwiseParameter
    exp_param: ExpParameter
    hdf5_data_param: HDF5DataParameter
    hdf5_output_param: HDF5OutputParameter
    hinge_loss_param: HingeLossParameter
    image_data_param: ImageDataParameter
    infogain_loss_param: InfogainLossParameter
    inner_product_param: InnerProductParameter
    lrn_param: LRNParameter
    memory_data_param: MemoryDataParameter
    mvn_param: MVNParameter
    pooling_param: PoolingParameter
    power_param: PowerParameter
    relu_param: ReLUParameter
    sigmoid_param: SigmoidParameter
    softmax_param: SoftmaxParameter
    slice_param: SliceParameter
    tanh_param: TanHParameter
    threshold_param: ThresholdParameter
    window_data_param: WindowDataParameter
    transform_param: TransformationParameter
    loss_param: LossParameter
    layer: V0LayerParameter
    bn_param: BNParameter
    batch_norm_param: BatchNormParameter
    def __init__(self, bottom: _Optional[_Iterable[str]] = ..., top: _Optional[_Iterable[str]] = ..., name: _Optional[str] = ..., include: _Optional[_Iterable[_Union[NetStateRule, _Mapping]]] = ..., exclude: _Optional[_Iterable[_Union[NetStateRule, _Mapping]]] = ..., type: _Optional[_Union[V1LayerParameter.LayerType, str]] = ..., blobs: _Optional[_Iterable[_Union[BlobProto, _Mapping]]] = ..., param: _Optional[_Iterable[str]] = ..., blob_share_mode: _Optional[_Iterable[_Union[V1LayerParameter.DimCheckMode, str]]] = ..., blobs_lr: _Optional[_Iterable[float]] = ..., weight_decay: _Optional[_Iterable[float]] = ..., loss_weight: _Optional[_Iterable[float]] = ..., accuracy_param: _Optional[_Union[AccuracyParameter, _Mapping]] = ..., argmax_param: _Optional[_Union[ArgMaxParameter, _Mapping]] = ..., concat_param: _Optional[_Union[ConcatParameter, _Mapping]] = ..., contrastive_loss_param: _Optional[_Union[ContrastiveLossParameter, _Mapping]] = ..., convolution_param: _Optional[_Union[ConvolutionParameter, _Mapping]] = ..., data_param: _Optional[_Union[DataParameter, _Mapping]] = ..., dropout_param: _Optional[_Union[DropoutParameter, _Mapping]] = ..., dummy_data_param: _Optional[_Union[DummyDataParameter, _Mapping]] = ..., eltwise_param: _Optional[_Union[EltwiseParameter, _Mapping]] = ..., exp_param: _Optional[_Union[ExpParameter, _Mapping]] = ..., hdf5_data_param: _Optional[_Union[HDF5DataParameter, _Mapping]] = ..., hdf5_output_param: _Optional[_Union[HDF5OutputParameter, _Mapping]] = ..., hinge_loss_param: _Optional[_Union[HingeLossParameter, _Mapping]] = ..., image_data_param: _Optional[_Union[ImageDataParameter, _Mapping]] = ..., infogain_loss_param: _Optional[_Union[InfogainLossParameter, _Mapping]] = ..., inner_product_param: _Optional[_Union[InnerProductParameter, _Mapping]] = ..., lrn_param: _Optional[_Union[LRNParameter, _Mapping]] = ..., memory_data_param: _Optional[_Union[MemoryDataParameter, _Mapping]] = ..., mvn_param: _Optional[_Union[MVNParameter, _Mapping]] = ..., pooling_param: _Optional[_Union[PoolingParameter, _Mapping]] = ..., power_param: _Optional[_Union[PowerParameter, _Mapping]] = ..., relu_param: _Optional[_Union[ReLUParameter, _Mapping]] = ..., sigmoid_param: _Optional[_Union[SigmoidParameter, _Mapping]] = ..., softmax_param: _Optional[_Union[SoftmaxParameter, _Mapping]] = ..., slice_param: _Optional[_Union[SliceParameter, _Mapping]] = ..., tanh_param: _Optional[_Union[TanHParameter, _Mapping]] = ..., threshold_param: _Optional[_Union[ThresholdParameter, _Mapping]] = ..., window_data_param: _Optional[_Union[WindowDataParameter, _Mapping]] = ..., transform_param: _Optional[_Union[TransformationParameter, _Mapping]] = ..., loss_param: _Optional[_Union[LossParameter, _Mapping]] = ..., layer: _Optional[_Union[V0LayerParameter, _Mapping]] = ..., bn_param: _Optional[_Union[BNParameter, _Mapping]] = ..., batch_norm_param: _Optional[_Union[BatchNormParameter, _Mapping]] = ...) -> None: ...

class V0LayerParameter(_message.Message):
    __slots__ = ("name", "type", "num_output", "biasterm", "weight_filler", "bias_filler", "pad", "kernelsize", "group", "stride", "pool", "dropout_ratio", "local_size", "alpha", "beta", "k", "source", "scale", "meanfile", "batchsize", "cropsize", "mirror", "blobs", "blobs_lr", "weight_decay", "rand_skip", "det_fg_threshold", "det_bg_threshold", "det_fg_fraction", "det_context_pad", "det_crop_mode", "new_num", "new_channels", "new_height", "new_width", "shuffle_images", "concat_dim", "hdf5_output_param")
    class PoolMethod(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        MAX: _ClassVar[V0LayerParameter.PoolMethod]
        AVE: _ClassVar[V0LayerParameter.PoolMethod]
        STOCHASTIC: _ClassVar[V0LayerParameter.PoolMethod]
    MAX: V0LayerParameter.PoolMethod
    AVE: V0LayerParameter.PoolMethod
    STOCHASTIC: V0LayerParameter.PoolMethod
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    BIASTERM_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FILLER_FIELD_NUMBER: _ClassVar[int]
    BIAS_FILLER_FIELD_NUMBER: _ClassVar[int]
    PAD_FIELD_NUMBER: _ClassVar[int]
    KERNELSIZE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    DROPOUT_RATIO_FIELD_NUMBER: _ClassVar[int]
    LOCAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    MEANFILE_FIELD_NUMBER: _ClassVar[int]
    BATCHSIZE_FIELD_NUMBER: _ClassVar[int]
    CROPSIZE_FIELD_NUMBER: _ClassVar[int]
    MIRROR_FIELD_NUMBER: _ClassVar[int]
    BLOBS_FIELD_NUMBER: _ClassVar[int]
    BLOBS_LR_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    RAND_SKIP_FIELD_NUMBER: _ClassVar[int]
    DET_FG_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    DET_BG_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    DET_FG_FRACTION_FIELD_NUMBER: _ClassVar[int]
    DET_CONTEXT_PAD_FIELD_NUMBER: _ClassVar[int]
    DET_CROP_MODE_FIELD_NUMBER: _ClassVar[int]
    NEW_NUM_FIELD_NUMBER: _ClassVar[int]
    NEW_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    NEW_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    NEW_WIDTH_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_IMAGES_FIELD_NUMBER: _ClassVar[int]
    CONCAT_DIM_FIELD_NUMBER: _ClassVar[int]
    HDF5_OUTPUT_PARAM_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    num_output: int
    biasterm: bool
    weight_filler: FillerParameter
    bias_filler: FillerParameter
    pad: int
    kernelsize: int
    group: int
    stride: int
    pool: V0LayerParameter.PoolMethod
    dropout_ratio: float
    local_size: int
    alpha: float
    beta: float
    k: float
    source: str
    scale: float
    meanfile: str
    batchsize: int
    cropsize: int
    mirror: bool
    blobs: _containers.RepeatedCompositeFieldContainer[BlobProto]
    blobs_lr: _containers.RepeatedScalarFieldContainer[float]
    weight_decay: _containers.RepeatedScalarFieldContainer[float]
    rand_skip: int
    det_fg_threshold: float
    det_bg_threshold: float
    det_fg_fraction: float
    det_context_pad: int
    det_crop_mode: str
    new_num: int
    new_channels: int
    new_height: int
    new_width: int
    shuffle_images: bool
    concat_dim: int
    hdf5_output_param: HDF5OutputParameter
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., num_output: _Optional[int] = ..., biasterm: _Optional[bool] = ..., weight_filler: _Optional[_Union[FillerParameter, _Mapping]] = ..., bias_filler: _Optional[_Union[FillerParameter, _Mapping]] = ..., pad: _Optional[int] = ..., kernelsize: _Optional[int] = ..., group: _Optional[int] = ..., stride: _Optional[int] = ..., pool: _Optional[_Union[V0LayerParameter.PoolMethod, str]] = ..., dropout_ratio: _Optional[float] = ..., local_size: _Optional[int] = ..., alpha: _Optional[float] = ..., beta: _Optional[float] = ..., k: _Optional[float] = ..., source: _Optional[str] = ..., scale: _Optional[float] = ..., meanfile: _Optional[str] = ..., batchsize: _Optional[int] = ..., cropsize: _Optional[int] = ..., mirror: _Optional[bool] = ..., blobs: _Optional[_Iterable[_Union[BlobProto, _Mapping]]] = ..., blobs_lr: _Optional[_Iterable[float]] = ..., weight_decay: _Optional[_Iterable[float]] = ..., rand_skip: _Optional[int] = ..., det_fg_threshold: _Optional[float] = ..., det_bg_threshold: _Optional[float] = ..., det_fg_fraction: _Optional[float] = ..., det_context_pad: _Optional[int] = ..., det_crop_mode: _Optional[str] = ..., new_num: _Optional[int] = ..., new_channels: _Optional[int] = ..., new_height: _Optional[int] = ..., new_width: _Optional[int] = ..., shuffle_images: _Optional[bool] = ..., concat_dim: _Optional[int] = ..., hdf5_output_param: _Optional[_Union[HDF5OutputParameter, _Mapping]] = ...) -> None: ...

class PReLUParameter(_message.Message):
    __slots__ = ("filler", "channel_shared")
    FILLER_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_SHARED_FIELD_NUMBER: _ClassVar[int]
    filler: FillerParameter
    channel_shared: bool
    def __init__(self, filler: _Optional[_Union[FillerParameter, _Mapping]] = ..., channel_shared: _Optional[bool] = ...) -> None: ...

class ROIPoolingParameter(_message.Message):
    __slots__ = ("pooled_h", "pooled_w", "spatial_scale")
    POOLED_H_FIELD_NUMBER: _ClassVar[int]
    POOLED_W_FIELD_NUMBER: _ClassVar[int]
    SPATIAL_SCALE_FIELD_NUMBER: _ClassVar[int]
    pooled_h: int
    pooled_w: int
    spatial_scale: float
    def __init__(self, pooled_h: _Optional[int] = ..., pooled_w: _Optional[int] = ..., spatial_scale: _Optional[float] = ...) -> None: ...

class SmoothL1LossParameter(_message.Message):
    __slots__ = ("sigma",)
    SIGMA_FIELD_NUMBER: _ClassVar[int]
    sigma: float
    def __init__(self, sigma: _Optional[float] = ...) -> None: ...

class PSROIPoolingParameter(_message.Message):
    __slots__ = ("spatial_scale", "output_dim", "group_size")
    SPATIAL_SCALE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_DIM_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    spatial_scale: float
    output_dim: int
    group_size: int
    def __init__(self, spatial_scale: _Optional[float] = ..., output_dim: _Optional[int] = ..., group_size: _Optional[int] = ...) -> None: ...

class InterpParameter(_message.Message):
    __slots__ = ("height", "width", "zoom_factor", "shrink_factor", "pad_beg", "pad_end", "use_blob_size")
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    ZOOM_FACTOR_FIELD_NUMBER: _ClassVar[int]
    SHRINK_FACTOR_FIELD_NUMBER: _ClassVar[int]
    PAD_BEG_FIELD_NUMBER: _ClassVar[int]
    PAD_END_FIELD_NUMBER: _ClassVar[int]
    USE_BLOB_SIZE_FIELD_NUMBER: _ClassVar[int]
    height: int
    width: int
    zoom_factor: int
    shrink_factor: int
    pad_beg: int
    pad_end: int
    use_blob_size: bool
    def __init__(self, height: _Optional[int] = ..., width: _Optional[int] = ..., zoom_factor: _Optional[int] = ..., shrink_factor: _Optional[int] = ..., pad_beg: _Optional[int] = ..., pad_end: _Optional[int] = ..., use_blob_size: _Optional[bool] = ...) -> None: ...

class BNParameter(_message.Message):
    __slots__ = ("slope_filler", "bias_filler", "momentum", "eps", "frozen", "engine", "bn_mode", "scale_filler", "shift_filler")
    class Engine(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        DEFAULT: _ClassVar[BNParameter.Engine]
        CAFFE: _ClassVar[BNParameter.Engine]
        CUDNN: _ClassVar[BNParameter.Engine]
    DEFAULT: BNParameter.Engine
    CAFFE: BNParameter.Engine
    CUDNN: BNParameter.Engine
    class BNMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        LEARN: _ClassVar[BNParameter.BNMode]
        INFERENCE: _ClassVar[BNParameter.BNMode]
    LEARN: BNParameter.BNMode
    INFERENCE: BNParameter.BNMode
    SLOPE_FILLER_FIELD_NUMBER: _ClassVar[int]
    BIAS_FILLER_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    FROZEN_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    BN_MODE_FIELD_NUMBER: _ClassVar[int]
    SCALE_FILLER_FIELD_NUMBER: _ClassVar[int]
    SHIFT_FILLER_FIELD_NUMBER: _ClassVar[int]
    slope_filler: FillerParameter
    bias_filler: FillerParameter
    momentum: float
    eps: float
    frozen: bool
    engine: BNParameter.Engine
    bn_mode: BNParameter.BNMode
    scale_filler: FillerParameter
    shift_filler: FillerParameter
    def __init__(self, slope_filler: _Optional[_Union[FillerParameter, _Mapping]] = ..., bias_filler: _Optional[_Union[FillerParameter, _Mapping]] = ..., momentum: _Optional[float] = ..., eps: _Optional[float] = ..., frozen: _Optional[bool] = ..., engine: _Optional[_Union[BNParameter.Engine, str]] = ..., bn_mode: _Optional[_Union[BNParameter.BNMode, str]] = ..., scale_filler: _Optional[_Union[FillerParameter, _Mapping]] = ..., shift_filler: _Optional[_Union[FillerParameter, _Mapping]] = ...) -> None: ...

class UpsampleParameter(_message.Message):
    __slots__ = ("scale", "dims_num", "scale_h", "scale_w", "pad_out_h", "pad_out_w", "upsample_h", "upsample_w")
    SCALE_FIELD_NUMBER: _ClassVar[int]
    DIMS_NUM_FIELD_NUMBER: _ClassVar[int]
    SCALE_H_FIELD_NUMBER: _ClassVar[int]
    SCALE_W_FIELD_NUMBER: _ClassVar[int]
    PAD_OUT_H_FIELD_NUMBER: _ClassVar[int]
    PAD_OUT_W_FIELD_NUMBER: _ClassVar[int]
    UPSAMPLE_H_FIELD_NUMBER: _ClassVar[int]
    UPSAMPLE_W_FIELD_NUMBER: _ClassVar[int]
    scale: int
    dims_num: int
    scale_h: int
    scale_w: int
    pad_out_h: bool
    pad_out_w: bool
    upsample_h: int
    upsample_w: int
    def __init__(self, scale: _Optional[int] = ..., dims_num: _Optional[int] = ..., scale_h: _Optional[int] = ..., scale_w: _Optional[int] = ..., pad_out_h: _Optional[bool] = ..., pad_out_w: _Optional[bool] = ..., upsample_h: _Optional[int] = ..., upsample_w: _Optional[int] = ...) -> None: ...

class DenseImageDataParameter(_message.Message):
    __slots__ = ("source", "batch_size", "rand_skip", "shuffle", "new_height", "new_width", "is_color", "mean_file", "root_folder", "mirror", "crop_width", "crop_height", "label_divide_factor")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    RAND_SKIP_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_FIELD_NUMBER: _ClassVar[int]
    NEW_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    NEW_WIDTH_FIELD_NUMBER: _ClassVar[int]
    IS_COLOR_FIELD_NUMBER: _ClassVar[int]
    MEAN_FILE_FIELD_NUMBER: _ClassVar[int]
    ROOT_FOLDER_FIELD_NUMBER: _ClassVar[int]
    MIRROR_FIELD_NUMBER: _ClassVar[int]
    CROP_WIDTH_FIELD_NUMBER: _ClassVar[int]
    CROP_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    LABEL_DIVIDE_FACTOR_FIELD_NUMBER: _ClassVar[int]
    source: str
    batch_size: int
    rand_skip: int
    shuffle: bool
    new_height: int
    new_width: int
    is_color: bool
    mean_file: str
    root_folder: str
    mirror: bool
    crop_width: int
    crop_height: int
    label_divide_factor: int
    def __init__(self, source: _Optional[str] = ..., batch_size: _Optional[int] = ..., rand_skip: _Optional[int] = ..., shuffle: _Optional[bool] = ..., new_height: _Optional[int] = ..., new_width: _Optional[int] = ..., is_color: _Optional[bool] = ..., mean_file: _Optional[str] = ..., root_folder: _Optional[str] = ..., mirror: _Optional[bool] = ..., crop_width: _Optional[int] = ..., crop_height: _Optional[int] = ..., label_divide_factor: _Optional[int] = ...) -> None: ...

class ShuffleChannelParameter(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: int
    def __init__(self, group: _Optional[int] = ...) -> None: ...

class InceptionColumnParameter(_message.Message):
    __slots__ = ("convolution_param", "pooling_param", "column_name")
    CONVOLUTION_PARAM_FIELD_NUMBER: _ClassVar[int]
    POOLING_PARAM_FIELD_NUMBER: _ClassVar[int]
    COLUMN_NAME_FIELD_NUMBER: _ClassVar[int]
    convolution_param: _containers.RepeatedCompositeFieldContainer[ConvolutionParameter]
    pooling_param: PoolingParameter
    column_name: str
    def __init__(self, convolution_param: _Optional[_Iterable[_Union[ConvolutionParameter, _Mapping]]] = ..., pooling_param: _Optional[_Union[PoolingParameter, _Mapping]] = ..., column_name: _Optional[str] = ...) -> None: ...

class InceptionParameter(_message.Message):
    __slots__ = ("relu_param", "weight_filler", "bias_filler", "need_relu", "relu_at_top", "inception_column")
    RELU_PARAM_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FILLER_FIELD_NUMBER: _ClassVar[int]
    BIAS_FILLER_FIELD_NUMBER: _ClassVar[int]
    NEED_RELU_FIELD_NUMBER: _ClassVar[int]
    RELU_AT_TOP_FIELD_NUMBER: _ClassVar[int]
    INCEPTION_COLUMN_FIELD_NUMBER: _ClassVar[int]
    relu_param: ReLUParameter
    weight_filler: FillerParameter
    bias_filler: FillerParameter
    need_relu: bool
    relu_at_top: bool
    inception_column: _containers.RepeatedCompositeFieldContainer[InceptionColumnParameter]
    def __init__(self, relu_param: _Optional[_Union[ReLUParameter, _Mapping]] = ..., weight_filler: _Optional[_Union[FillerParameter, _Mapping]] = ..., bias_filler: _Optional[_Union[FillerParameter, _Mapping]] = ..., need_relu: _Optional[bool] = ..., relu_at_top: _Optional[bool] = ..., inception_column: _Optional[_Iterable[_Union[InceptionColumnParameter, _Mapping]]] = ...) -> None: ...

class ResizeLayerParameter(_message.Message):
    __slots__ = ("height", "width", "is_pyramid_test", "out_height_scale", "out_width_scale")
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    IS_PYRAMID_TEST_FIELD_NUMBER: _ClassVar[int]
    OUT_HEIGHT_SCALE_FIELD_NUMBER: _ClassVar[int]
    OUT_WIDTH_SCALE_FIELD_NUMBER: _ClassVar[int]
    height: int
    width: int
    is_pyramid_test: bool
    out_height_scale: float
    out_width_scale: float
    def __init__(self, height: _Optional[int] = ..., width: _Optional[int] = ..., is_pyramid_test: _Optional[bool] = ..., out_height_scale: _Optional[float] = ..., out_width_scale: _Optional[float] = ...) -> None: ...

class HardSigmoidParameter(_message.Message):
    __slots__ = ("alpha", "beta")
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    alpha: float
    beta: float
    def __init__(self, alpha: _Optional[float] = ..., beta: _Optional[float] = ...) -> None: ...

class UnsqueezeParameter(_message.Message):
    __slots__ = ("dim",)
    DIM_FIELD_NUMBER: _ClassVar[int]
    dim: int
    def __init__(self, dim: _Optional[int] = ...) -> None: ...

class ReLU6Parameter(_message.Message):
    __slots__ = ("negative_slope", "threshold")
    NEGATIVE_SLOPE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    negative_slope: float
    threshold: float
    def __init__(self, negative_slope: _Optional[float] = ..., threshold: _Optional[float] = ...) -> None: ...

class PadParameter(_message.Message):
    __slots__ = ("pad_type", "pad_u", "pad_d", "pad_l", "pad_r", "pad_value")
    class PadType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        CONSTANT: _ClassVar[PadParameter.PadType]
        REPLICATE: _ClassVar[PadParameter.PadType]
        REFLECT: _ClassVar[PadParameter.PadType]
    CONSTANT: PadParameter.PadType
    REPLICATE: PadParameter.PadType
    REFLECT: PadParameter.PadType
    PAD_TYPE_FIELD_NUMBER: _ClassVar[int]
    PAD_U_FIELD_NUMBER: _ClassVar[int]
    PAD_D_FIELD_NUMBER: _ClassVar[int]
    PAD_L_FIELD_NUMBER: _ClassVar[int]
    PAD_R_FIELD_NUMBER: _ClassVar[int]
    PAD_VALUE_FIELD_NUMBER: _ClassVar[int]
    pad_type: PadParameter.PadType
    pad_u: int
    pad_d: int
    pad_l: int
    pad_r: int
    pad_value: float
    def __init__(self, pad_type: _Optional[_Union[PadParameter.PadType, str]] = ..., pad_u: _Optional[int] = ..., pad_d: _Optional[int] = ..., pad_l: _Optional[int] = ..., pad_r: _Optional[int] = ..., pad_value: _Optional[float] = ...) -> None: ...

class BilinearInterpolateParameter(_message.Message):
    __slots__ = ("dst_h", "dst_w", "scale_factor", "align_corners")
    DST_H_FIELD_NUMBER: _ClassVar[int]
    DST_W_FIELD_NUMBER: _ClassVar[int]
    SCALE_FACTOR_FIELD_NUMBER: _ClassVar[int]
    ALIGN_CORNERS_FIELD_NUMBER: _ClassVar[int]
    dst_h: int
    dst_w: int
    scale_factor: float
    align_corners: bool
    def __init__(self, dst_h: _Optional[int] = ..., dst_w: _Optional[int] = ..., scale_factor: _Optional[float] = ..., align_corners: _Optional[bool] = ...) -> None: ...

class MaxUnPoolParameter(_message.Message):
    __slots__ = ("dst_h", "dst_w")
    DST_H_FIELD_NUMBER: _ClassVar[int]
    DST_W_FIELD_NUMBER: _ClassVar[int]
    dst_h: int
    dst_w: int
    def __init__(self, dst_h: _Optional[int] = ..., dst_w: _Optional[int] = ...) -> None: ...

class PixelShuffleParameter(_message.Message):
    __slots__ = ("upscale_factor",)
    UPSCALE_FACTOR_FIELD_NUMBER: _ClassVar[int]
    upscale_factor: int
    def __init__(self, upscale_factor: _Optional[int] = ...) -> None: ...

class ProposalParameter(_message.Message):
    __slots__ = ("feat_stride", "base_size", "min_size", "ratio", "scale", "pre_nms_topn", "post_nms_topn", "nms_thresh")
    FEAT_STRIDE_FIELD_NUMBER: _ClassVar[int]
    BASE_SIZE_FIELD_NUMBER: _ClassVar[int]
    MIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    RATIO_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    PRE_NMS_TOPN_FIELD_NUMBER: _ClassVar[int]
    POST_NMS_TOPN_FIELD_NUMBER: _ClassVar[int]
    NMS_THRESH_FIELD_NUMBER: _ClassVar[int]
    feat_stride: int
    base_size: int
    min_size: int
    ratio: _containers.RepeatedScalarFieldContainer[float]
    scale: _containers.RepeatedScalarFieldContainer[float]
    pre_nms_topn: int
    post_nms_topn: int
    nms_thresh: float
    def __init__(self, feat_stride: _Optional[int] = ..., base_size: _Optional[int] = ..., min_size: _Optional[int] = ..., ratio: _Optional[_Iterable[float]] = ..., scale: _Optional[_Iterable[float]] = ..., pre_nms_topn: _Optional[int] = ..., post_nms_topn: _Optional[int] = ..., nms_thresh: _Optional[float] = ...) -> None: ...
