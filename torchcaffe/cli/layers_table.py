"""Print the supported-layers table (Markdown), generated from the layer registry.

torchcaffe layers [--out docs/supported_layers.md]
"""

from __future__ import annotations

import argparse

from ..formats.atomic import atomic_write
from ..ops.catalogue import supported_layers_markdown


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", help="write to this file instead of stdout")


def main(args: argparse.Namespace) -> int:
    text = supported_layers_markdown()
    if args.out:
        with atomic_write(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        print(text, end="")
    return 0
