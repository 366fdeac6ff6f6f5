"""Load a model of a Caffe fork with torchcaffe: its own caffe.proto, its own layer type.

    python examples/forks/run_fork.py [--work DIR]

Passes the fork's caffe.proto (here: a made-up fork's, written by ``fork_proto.py``), registers
its ``ChannelGate`` layer in Python (``channel_gate.py``), then: runs forward and backward
through the Caffe face, fine-tunes one SGD step, saves a caffemodel, and reloads it into a fresh
net whose outputs match. See docs/forks.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import channel_gate  # noqa: E402,F401  (registers the ChannelGate layer)
from fork_proto import write_fork_proto  # noqa: E402

import torchcaffe as caffe  # noqa: E402

NET = HERE / "net.prototxt"


def feed(net, rng: np.random.Generator) -> None:
    net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].data.shape)
    net.blobs["label"].data[...] = rng.integers(0, 5, net.blobs["label"].data.shape)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", help="folder for the solver file and caffemodel (default: temp)")
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="torchcaffe_fork_"))
    work.mkdir(parents=True, exist_ok=True)
    proto = write_fork_proto(work)  # the file a fork's user would pass
    rng = np.random.default_rng(0)

    # 1. The Caffe face: forward and backward through the fork's layer.
    net = caffe.Net(str(NET), caffe.TRAIN, caffe_proto=str(proto))
    feed(net, rng)
    loss = float(net.forward()["loss"])
    net.backward()
    gate_diff = net.params["gate1"][0].diff
    print(f"forward: loss {loss:.6f}; backward: |d loss / d gate| = {np.abs(gate_diff).sum():.6f}")
    torch_net = caffe.load(NET, phase="train", caffe_proto=proto)  # the torch face
    gate = torch_net.layers["gate1"]
    print(f"ChannelGate reads the fork's {type(gate.param).__name__}: gate_bias {gate.gate_bias}")

    # 2. One fine-tuning step with the fork's schema (the solver's net holds the fork layer).
    solver_text = (HERE / "solver.prototxt").read_text().replace('"net.prototxt"', f'"{NET}"')
    solver_path = work / "solver.prototxt"
    solver_path.write_text(solver_text.replace('"gated"', f'"{work / "gated"}"'))
    solver = caffe.SGDSolver(str(solver_path), caffe_proto=str(proto))
    feed(solver.net, np.random.default_rng(1))
    before = solver.net.params["gate1"][0].data.copy()
    solver.step(1)
    after = solver.net.params["gate1"][0].data
    print(f"one SGD step moved the gates by {np.abs(after - before).sum():.6f}")

    # 3. Save a caffemodel and reload it into a fresh net: same outputs.
    weights = work / "gated.caffemodel"
    solver.net.save(str(weights))
    fresh = caffe.Net(str(NET), caffe.TEST, weights=str(weights), caffe_proto=str(proto))
    outs = []
    for each in (solver.net, fresh):
        feed(each, np.random.default_rng(2))
        outs.append(each.forward()["loss"].copy())
    same = bool(np.array_equal(outs[0], outs[1]))
    print(f"saved {weights.name}; a fresh net reloaded from it gives the same loss: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
