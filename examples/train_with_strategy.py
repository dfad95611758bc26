"""Train a zoo model under a Stratagem strategy, one process per replica.

Make a strategy (here from a pre-built builder; normally it comes from the service), then launch:

    python examples/train_with_strategy.py make-strategy --model dlrm --builder Parallax --nproc 2 --out best.json
    python -m stratagem.launch --strategy best.json --nproc-per-node 2 examples/train_with_strategy.py --model dlrm

On a GPU cluster, torchrun does the launching: set STRATAGEM_STRATEGY=best.json on every node and run
`torchrun --nnodes ... --nproc-per-node ... examples/train_with_strategy.py --model gpt` (docs/runtime.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stratagem import ResourceSpec, capture, distribute
from stratagem.builders import BUILDERS
from stratagem.runtime import init_from_env
from stratagem.zoo import build


def make_strategy(args: argparse.Namespace) -> None:
    """Capture the model and run a builder for a cluster (a spec file, or this machine with --nproc CPUs)."""
    module, make_batch = build(args.model, "small")
    graph = capture(
        module,
        make_batch(args.batch),
        batch_size=args.batch,
        optimizer="momentum" if args.optimizer == "sgd" else args.optimizer,
    )
    if args.spec:
        resources = (
            ResourceSpec.from_autodist_yaml(Path(args.spec))
            if args.spec.endswith((".yml", ".yaml"))
            else ResourceSpec.load(args.spec)
        )
    else:
        resources = ResourceSpec.parse(
            {"nodes": [{"address": "127.0.0.1", "cpus": list(range(args.nproc)), "device": "CPU"}]}
        )
    strategy = BUILDERS[args.builder]().build(graph, resources)
    strategy.save(args.out)
    print(f"wrote {args.out}: {strategy.describe()}")


def _optimizer(name: str, params: list[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def train(args: argparse.Namespace) -> None:
    env = init_from_env()
    if env.strategy is None:
        raise SystemExit(
            "no strategy: run under `python -m stratagem.launch --strategy FILE` or set STRATAGEM_STRATEGY"
        )
    torch.manual_seed(0)
    module, make_batch = build(args.model, "small")
    model, optimizer = distribute(module, _optimizer(args.optimizer, list(module.parameters()), args.lr), env.strategy)
    torch.manual_seed(1000 + env.rank)  # each rank feeds its own data
    losses, steps = [], []
    for step in range(args.steps):
        loss = model(*make_batch(args.batch))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
        steps.append(optimizer.sync_stats.as_dict())
        if env.rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            s = optimizer.sync_stats
            print(
                f"step {step}: loss {losses[-1]:.4f}, step {s.step_s * 1e3:.1f} ms, waiting on sync {s.sync_wait_s * 1e3:.1f} ms",
                flush=True,
            )
    if args.out_dir:
        checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
        result = {"rank": env.rank, "losses": losses, "stats": steps, "checksum": checksum}
        Path(args.out_dir, f"rank{env.rank}.json").write_text(json.dumps(result))
    # Every rank finishes its collectives before any closes its connections: a gloo peer that is still
    # receiving when the other side goes away aborts its process.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", default="train", choices=["train", "make-strategy"])
    parser.add_argument("--model", default="dlrm", choices=["dlrm", "resnet50", "vgg16", "bert_large", "gpt"])
    parser.add_argument("--optimizer", default="sgd", choices=["sgd", "adam", "adagrad"])
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batch", type=int, default=8, help="per-rank batch size")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out-dir", default=None, help="write each rank's losses and step stats here")
    parser.add_argument("--builder", default="Parallax", choices=sorted(BUILDERS))
    parser.add_argument("--nproc", type=int, default=2, help="make-strategy: CPUs of this machine to use")
    parser.add_argument("--spec", default=None, help="make-strategy: a ResourceSpec JSON or AutoDist YAML")
    parser.add_argument("--out", default="strategy.json", help="make-strategy: where to write the strategy")
    args = parser.parse_args()
    make_strategy(args) if args.command == "make-strategy" else train(args)


if __name__ == "__main__":
    main()
