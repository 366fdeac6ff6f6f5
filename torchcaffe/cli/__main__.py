"""``torchcaffe <action> ...``: one small module per action, registered by name.

Like the ``caffe`` tool's RegisterBrewFunction table: ``run`` (forward a net, report its
outputs), ``layers`` (the supported-layers table), ``upgrade`` (upgrade_net_proto_text),
``train`` (Caffe's solver loop).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from ..errors import TorchCaffeError
from . import (
    compare,
    convert,
    layers_table,
    run,
    train,
    upgrade,
    upgrade_net_proto_binary,
    upgrade_net_proto_text,
)

Action = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
ACTIONS: dict[str, Action] = {
    "run": (run.add_arguments, run.main),
    "layers": (layers_table.add_arguments, layers_table.main),
    "upgrade": (upgrade.add_arguments, upgrade.main),
    "train": (train.add_arguments, train.main),
    "convert": (convert.add_arguments, convert.main),
    "compare": (compare.add_arguments, compare.main),
    "upgrade_net_proto_text": (upgrade_net_proto_text.add_arguments, upgrade_net_proto_text.main),
    "upgrade_net_proto_binary": (
        upgrade_net_proto_binary.add_arguments,
        upgrade_net_proto_binary.main,
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torchcaffe", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    for name, (add_arguments, _) in ACTIONS.items():
        module = sys.modules[ACTIONS[name][1].__module__]
        add_arguments(sub.add_parser(name, help=(module.__doc__ or "").splitlines()[0]))
    args = parser.parse_args(argv)
    try:
        return ACTIONS[args.action][1](args)
    except TorchCaffeError as err:  # a user's file problem: one clear line, no traceback
        print(f"torchcaffe {args.action}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
