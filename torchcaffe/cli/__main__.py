"""``torchcaffe <action> ...``: one small module per action, registered by name.

Like the ``caffe`` tool's RegisterBrewFunction table. Flags are gflags-style in every action:
``-flag value``, ``--flag value``, ``-flag=value`` and ``--flag=value`` all work.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

from .. import __version__, glog
from ..errors import TorchCaffeError
from ..formats.user_schema import use_schema
from . import (
    compare,
    compute_image_mean,
    convert,
    convert_imageset,
    device_query,
    draw_net,
    extract_features,
    layers_table,
    run,
    test,
    time_net,
    train,
    upgrade,
    upgrade_net_proto_binary,
    upgrade_net_proto_text,
    upgrade_solver_proto_text,
)
from .flags import (
    CAFFE_VALUED,
    GLOG_ACTED_ON,
    GLOG_VALUED,
    FlagParser,
    expand_flag_sources,
    gflags_argv,
    glog_log_dir,
    glog_minloglevel,
)

Action = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
# One line per action: name -> (add_arguments, main).
ACTIONS: dict[str, Action] = {
    "run": (run.add_arguments, run.main),
    "layers": (layers_table.add_arguments, layers_table.main),
    "upgrade": (upgrade.add_arguments, upgrade.main),
    "train": (train.add_arguments, train.main),
    "convert_imageset": (convert_imageset.add_arguments, convert_imageset.main),
    "compute_image_mean": (compute_image_mean.add_arguments, compute_image_mean.main),
    "extract_features": (extract_features.add_arguments, extract_features.main),
    "draw_net": (draw_net.add_arguments, draw_net.main),
    "test": (test.add_arguments, test.main),
    "time": (time_net.add_arguments, time_net.main),
    "device_query": (device_query.add_arguments, device_query.main),
    "convert": (convert.add_arguments, convert.main),
    "compare": (compare.add_arguments, compare.main),
    "upgrade_net_proto_text": (upgrade_net_proto_text.add_arguments, upgrade_net_proto_text.main),
    "upgrade_net_proto_binary": (
        upgrade_net_proto_binary.add_arguments,
        upgrade_net_proto_binary.main,
    ),
    "upgrade_solver_proto_text": (
        upgrade_solver_proto_text.add_arguments,
        upgrade_solver_proto_text.main,
    ),
}

# Actions that read nets or solvers and so take --caffe-proto (a fork's schema, user_schema).
READS_NETS = frozenset({"run", "train", "test", "time", "draw_net", "extract_features"})
# the caffe tool's actions, which take (and ignore) each other's flags as caffe.cpp does
CAFFE_ACTIONS = frozenset({"train", "test", "time", "device_query"})


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and each action's own parser."""
    parser: argparse.ArgumentParser = FlagParser(
        prog="torchcaffe", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="action", required=True, parser_class=FlagParser)
    actions: dict[str, argparse.ArgumentParser] = {}
    for name, (add_arguments, action_main) in ACTIONS.items():
        doc = sys.modules[action_main.__module__].__doc__ or ""
        actions[name] = sub.add_parser(name, help=_summary(doc), description=doc)
        actions[name].formatter_class = argparse.RawDescriptionHelpFormatter
        add_arguments(actions[name])
        if name in READS_NETS:
            actions[name].add_argument(
                "--caffe-proto",
                metavar="CAFFE.PROTO",
                help="a Caffe fork's own complete caffe.proto, for its fields (docs/forks.md)",
            )
    return parser, actions


def _summary(doc: str) -> str:
    """An action's line in ``torchcaffe -h``: its docstring's first paragraph (a first sentence
    can run over two lines, so its first line alone would stop mid-sentence)."""
    return " ".join(doc.split("\n\n")[0].split())


def split_action(argv: list[str]) -> tuple[str | None, list[str]]:
    """The action name (the first word naming one; gflags lets flags come first) and the rest.

    A word that is the value of a flag before it is no action: in ``-stage test time`` the
    action is ``time``, as gflags takes ``test`` as -stage's value."""
    valued = CAFFE_VALUED | GLOG_VALUED
    is_value = False
    for i, token in enumerate(argv):
        if token in ACTIONS and not is_value:
            return token, argv[:i] + argv[i + 1 :]
        is_value = token.lstrip("-") in valued and token.startswith("-") and not is_value
    return None, argv


def _no_action(argv: list[str]) -> int:
    """Caffe's tool shows its usage without an action: one line here naming the actions (not
    argparse's "invalid choice" for a flag's value, as for ``torchcaffe -solver s.prototxt``)."""
    unknown = f"unknown action {argv[0]!r}" if argv and not argv[0].startswith("-") else None
    print(
        f"torchcaffe: error: {unknown or 'no action given'}; the first word names one of: "
        f"{', '.join(ACTIONS)} (torchcaffe -h, torchcaffe ACTION -h for their flags)",
        file=sys.stderr,
    )
    return 2


def _show_warning(action: str, message: Warning | str, category: type, *rest: Any) -> None:
    """A warning as one line naming the tool (not the source line that raised it)."""
    print(f"torchcaffe {action}: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, actions = build_parser()
    action, rest = split_action(argv)
    if action is None:
        if any(token in ("-h", "--help", "-help") for token in argv):  # gflags' -help too
            parser.parse_args(["--help"])  # prints the help and exits
        if any(token in ("-version", "--version") for token in argv):  # gflags' builtin
            print(f"torchcaffe version {__version__}")
            return 0
        return _no_action(argv)
    else:
        program = "caffe" if action in CAFFE_ACTIONS else action  # glog's and gflags' name
        try:
            rest = expand_flag_sources(rest, program, os.environ)
        except TorchCaffeError as err:
            print(f"torchcaffe {action}: error: {err}", file=sys.stderr)
            return 2
        ignored = CAFFE_VALUED if action in CAFFE_ACTIONS else frozenset()
        dropped: list[str] = []
        args = actions[action].parse_args(gflags_argv(actions[action], rest, ignored, dropped))
        for name in dropped:  # accepted as Caffe's tools accept them, but not acted on
            if name in GLOG_ACTED_ON:
                continue
            print(
                f"torchcaffe {action}: note: glog's -{name} has no effect "
                "(torchcaffe logs through Python's logging, to stderr)",
                file=sys.stderr,
            )
        args.action = action
    try:
        with (
            use_schema(getattr(args, "caffe_proto", None)),
            glog.minloglevel(glog_minloglevel(rest)),
            # caffe.cpp's files are caffe.INFO & co., each other tool's its own name's
            glog.log_files(glog_log_dir(rest, os.environ), program),
            warnings.catch_warnings(),
        ):
            warnings.showwarning = functools.partial(_show_warning, args.action)
            return ACTIONS[args.action][1](args)
    except TorchCaffeError as err:  # a user's file problem: one clear line, no traceback
        print(f"torchcaffe {args.action}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a file that cannot be opened or written
        name = f"{err.filename}: " if err.filename else ""
        print(f"torchcaffe {args.action}: error: {name}{err.strerror or err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C (train handles its own SIGINT): no traceback
        print(f"torchcaffe {args.action}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
