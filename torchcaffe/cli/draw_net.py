"""Draw a net's graph to an image file (PNG/SVG/PDF by extension), as Caffe's draw_net.py.

torchcaffe draw_net NET.prototxt OUT.png [--rankdir LR] [--phase TRAIN|TEST|ALL] [--display_lrm]
"""

from __future__ import annotations

import argparse

from .. import draw
from ..formats.prototxt import read_net
from ..formats.upgrade import upgrade_net_as_needed
from ..proto import caffe_pb2


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input_net_proto_file")
    p.add_argument("output_image_file")
    p.add_argument("--rankdir", default="LR", choices=["LR", "TB", "BT", "RL"])
    p.add_argument("--phase", default="ALL", choices=["TRAIN", "TEST", "ALL"])
    p.add_argument(
        "--display_lrm", action="store_true", help="show each layer's learning-rate multipliers"
    )


def main(args: argparse.Namespace) -> int:
    # draw_net.py draws the file as written: `input:` fields are no Input layer box. A legacy
    # (V0/V1 `layers`) net, which draw_net.py would draw empty, is upgraded.
    net = read_net(args.input_net_proto_file, upgrade=False)
    if len(net.layers):
        net = upgrade_net_as_needed(net, args.input_net_proto_file)
    phase = None if args.phase == "ALL" else caffe_pb2.Phase.Value(args.phase)
    draw.draw_net_to_file(net, args.output_image_file, args.rankdir, phase, args.display_lrm)
    print(f"drew {args.input_net_proto_file} -> {args.output_image_file}")
    return 0
