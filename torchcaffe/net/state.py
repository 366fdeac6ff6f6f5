"""NetState filtering (Caffe's Net::FilterNet / StateMeetsRule): pure functions on protos."""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterable

from ..errors import ConfigError, LayerParamError, UsageError
from ..proto import caffe_pb2

PHASES = {"train": caffe_pb2.TRAIN, "test": caffe_pb2.TEST}


class Phase(int):
    """pycaffe's ``caffe.TRAIN``/``caffe.TEST``: a Boost.Python enum, an int whose ``str`` is
    its name, so py-faster-rcnn's ``cfg[str(self.phase)]`` finds ``cfg['TRAIN']``."""

    def __str__(self) -> str:
        return caffe_pb2.Phase.Name(int(self))

    def __repr__(self) -> str:
        return f"caffe._caffe.Phase.{self}"


def parse_phase(phase: int | str) -> caffe_pb2.Phase:
    """Accept caffe_pb2.TRAIN/TEST, 0/1, or "train"/"test" (any case)."""
    if isinstance(phase, str):
        try:
            return PHASES[phase.lower()]
        except KeyError:
            raise LayerParamError(
                "unknown phase", expected="'train' or 'test'", got=repr(phase)
            ) from None
    if phase not in (caffe_pb2.TRAIN, caffe_pb2.TEST):
        raise LayerParamError("unknown phase", expected="caffe.TRAIN or caffe.TEST", got=phase)
    return caffe_pb2.TRAIN if phase == caffe_pb2.TRAIN else caffe_pb2.TEST


def stage_list(stages: Iterable[str]) -> list[str]:
    """``stages`` as a list of stage names. A lone string is refused: iterating it would give
    one stage per character and silently pick the wrong layers (pycaffe's Boost.Python loop
    does just that, so the Caffe face splits it itself before it gets here)."""
    if isinstance(stages, (str, bytes)):
        raise UsageError(
            "stages is a list of stage names, not one string",
            expected=f"e.g. [{stages!r}]",
            got=repr(stages),
        )
    return list(stages)


def make_state(phase: int | str, level: int = 0, stages: Iterable[str] = ()) -> caffe_pb2.NetState:
    """The NetState a net is built in; ``level`` and ``stages`` are checked here, where the
    proto would raise its own TypeError or ValueError."""
    if not isinstance(level, numbers.Integral):
        path = isinstance(level, (str, os.PathLike))  # caffe.Net(proto, TEST, "w.caffemodel")
        hint = "weights go in weights=..., or caffe.Net(proto, weights, phase)" if path else None
        raise UsageError("level (NetState.level) is an integer", got=repr(level), hint=hint)
    if not -(2**31) <= int(level) < 2**31:
        raise ConfigError("level out of range", expected="a 32-bit integer", got=int(level))
    names = stage_list(stages)
    odd = [s for s in names if not isinstance(s, str)]
    if odd:
        raise UsageError("stages are stage names (strings)", got=repr(odd[0]))
    state = caffe_pb2.NetState(phase=parse_phase(phase), level=int(level))
    state.stage.extend(names)
    return state


def state_meets_rule(state: caffe_pb2.NetState, rule: caffe_pb2.NetStateRule) -> bool:
    """True when ``state`` satisfies every condition ``rule`` sets."""
    if rule.HasField("phase") and rule.phase != state.phase:
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        return False
    stages = set(state.stage)
    if any(s not in stages for s in rule.stage):
        return False
    if any(s in stages for s in rule.not_stage):
        return False
    return True


def layer_included(
    layer: caffe_pb2.LayerParameter, state: caffe_pb2.NetState, path: str | None = None
) -> bool:
    if layer.include and layer.exclude:
        raise LayerParamError(
            "specify either include rules or exclude rules, not both",
            path=path,
            layer=layer.name,
            layer_type=layer.type,
        )
    if layer.include:
        return any(state_meets_rule(state, r) for r in layer.include)
    return not any(state_meets_rule(state, r) for r in layer.exclude)


def filter_net(
    net: caffe_pb2.NetParameter, state: caffe_pb2.NetState | None = None, path: str | None = None
) -> caffe_pb2.NetParameter:
    """A copy of ``net`` holding only the layers its state (or ``state``) includes."""
    state = net.state if state is None else state
    out = caffe_pb2.NetParameter()
    out.CopyFrom(net)
    out.state.CopyFrom(state)
    del out.layer[:]
    for layer in net.layer:
        if layer_included(layer, state, path):
            out.layer.add().CopyFrom(layer)
    return out
