"""The made-up fork's caffe.proto, written from torchcaffe's proto/caffe.proto.

A real fork ships its whole caffe.proto (Caffe's, plus its additions) and you pass that file.
This example keeps only the fork's three additions here, each marked "FORK ADDITION", so the
repository does not carry a second copy of the schema: a ChannelGate layer's parameter message,
the LayerParameter field that holds it, and a new ConvolutionParameter field.
"""

from __future__ import annotations

from pathlib import Path

OUR_PROTO = Path(__file__).resolve().parents[2] / "proto" / "caffe.proto"

# (anchor in our caffe.proto, text inserted right after it)
ADDITIONS = [
    (
        "message LayerParameter {\n",
        "  // FORK ADDITION: parameters of the fork's ChannelGate layer.\n"
        "  optional ChannelGateParameter channel_gate_param = 4242;\n",
    ),
    (
        "message ConvolutionParameter {\n",
        "  // FORK ADDITION: a hint the fork's tools read; Caffe's Convolution does not use it.\n"
        "  optional float fork_lr_hint = 4243 [default = 1];\n",
    ),
]
NEW_MESSAGE = """
// FORK ADDITION: y = x * sigmoid(gate + gate_bias), one learnable gate per channel.
message ChannelGateParameter {
  optional float gate_bias = 1 [default = 0];
  optional FillerParameter gate_filler = 2;  // default: constant 0
}
"""


def write_fork_proto(folder: Path) -> Path:
    """Write the fork's complete caffe.proto into ``folder``; returns its path."""
    text = OUR_PROTO.read_text()
    for anchor, added in ADDITIONS:
        if text.count(anchor) != 1:
            raise SystemExit(f"{OUR_PROTO}: expected one {anchor.strip()!r}")
        text = text.replace(anchor, anchor + added)
    path = Path(folder) / "caffe.proto"
    path.write_text(text + NEW_MESSAGE)
    return path
