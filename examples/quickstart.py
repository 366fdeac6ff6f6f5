"""torchcaffe's main job, end to end, on a built-in example (LeNet on synthetic digits).

    python examples/quickstart.py [--iters 300] [--out OUT_DIR] [--device cpu]

1. compile a Caffe train/test prototxt into a torch module (its Data layers fed by tensors);
2. train it with a plain torch optimizer on Caffe's own objective (loss_weight-weighted tops);
3. write the weights as a caffemodel (atomically, in Caffe's wire format);
4. load the deploy prototxt + caffemodel through the pycaffe face (`import torchcaffe as caffe`)
   and check it computes exactly what the trained torch module computes.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import torchcaffe
import torchcaffe as caffe

HERE = Path(__file__).resolve().parent / "lenet"


def synthetic_digits(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Ten fixed random 28x28 prototypes plus noise, in [0, 255] like raw MNIST pixels."""
    protos = torch.rand(10, 1, 28, 28, generator=torch.Generator().manual_seed(7)) * 255
    labels = torch.randint(0, 10, (n,), generator=gen)
    noise = torch.randn(n, 1, 28, 28, generator=gen) * 60
    return (protos[labels] + noise).clamp(0, 255), labels.float()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--out", type=Path, default=None, help="where to write the caffemodel")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="torchcaffe_quickstart_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    torchcaffe.set_random_seed(0)
    gen = torch.Generator().manual_seed(0)

    # 1. compile: Data layers become inputs of the shapes we feed
    train = torchcaffe.load(
        HERE / "lenet_train_test.prototxt",
        phase="train",
        input_shapes={"data": (64, 1, 28, 28), "label": (64,)},
    )
    train = train.to(args.device)
    print(
        f"compiled {train.name}: {len(train.steps)} layers, "
        f"{sum(p.numel() for p in train.parameters()):,} parameters, "
        f"inputs {train.input_names}, loss tops {train.loss_weights()}"
    )

    # 2. train with a torch optimizer; the scale 1/256 is the Data layer's transform_param
    opt = torch.optim.SGD(train.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    start = time.perf_counter()
    for it in range(args.iters):
        x, y = synthetic_digits(64, gen)
        blobs = train.forward_all_blobs(
            data=(x * 0.00390625).to(args.device), label=y.to(args.device)
        )
        loss = train.total_loss(blobs)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if it % 100 == 0 or it == args.iters - 1:
            print(f"  iter {it:4d}  loss {loss.item():.4f}")
    print(f"trained {args.iters} iterations in {time.perf_counter() - start:.1f} s")

    # 3. write the caffemodel
    weights = out_dir / "lenet_quickstart.caffemodel"
    torchcaffe.save_weights(train, weights)
    print(f"wrote {weights} ({weights.stat().st_size:,} bytes)")

    # 4. reload through the pycaffe face and compare with the trained module
    deploy = caffe.Net(str(HERE / "lenet_deploy.prototxt"), str(weights), caffe.TEST)
    x, y = synthetic_digits(100, gen)
    scaled = (x * 0.00390625).numpy()
    prob = deploy.forward(data=scaled)["prob"]
    accuracy = float((prob.argmax(1) == y.numpy()).mean())
    train.eval()
    with torch.no_grad():
        ip2 = (
            train.forward_all_blobs(
                data=torch.from_numpy(scaled).to(args.device), label=y.to(args.device)
            )["ip2"]
            .cpu()
            .numpy()
        )
    torch_prob = torch.softmax(torch.from_numpy(ip2), 1).numpy()
    gap = float(np.abs(torch_prob - prob).max())
    print(
        f"deploy net from the caffemodel: accuracy {accuracy:.3f} on 100 held-out digits; "
        f"max |prob - torch module prob| = {gap:.2e}"
    )
    return 0 if gap < 1e-5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
