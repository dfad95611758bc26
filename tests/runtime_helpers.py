"""Helpers for runtime tests: spawn N gloo ranks, tiny models, generated data, strategy factories.

`run_ranks("module:function", world_size, payload)` starts one fresh Python process per rank (this
file as a script), initializes gloo over 127.0.0.1, calls `function(rank, world_size, payload)` and
returns every rank's JSON result. Results travel as JSON files, never pickles.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def run_ranks(
    target: str, world_size: int, payload: dict[str, Any] | None = None, *, timeout_s: float = 240
) -> list[dict[str, Any]]:
    """Run `target` on `world_size` gloo ranks and return their results, rank by rank."""
    from stratagem.runtime.launch import free_port

    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        (tmpdir / "payload.json").write_text(json.dumps(payload or {}))
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
            WORLD_SIZE=str(world_size),
            OMP_NUM_THREADS="1",
            PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]),
        )
        procs = []
        for rank in range(world_size):
            log = open(tmpdir / f"log{rank}.txt", "w")  # noqa: SIM115 - closed after the process ends
            procs.append(
                (
                    subprocess.Popen(
                        [sys.executable, __file__, target, str(tmpdir)],
                        env=dict(env, RANK=str(rank)),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    ),
                    log,
                )
            )
        _wait(procs, timeout_s)
        results = []
        for rank in range(world_size):
            out = tmpdir / f"rank{rank}.json"
            if not out.exists():
                logs = "\n".join(
                    f"--- rank {r} ---\n{(tmpdir / f'log{r}.txt').read_text()[-4000:]}" for r in range(world_size)
                )
                raise AssertionError(f"rank {rank} of {target} produced no result\n{logs}")
            results.append(json.loads(out.read_text()))
        return results


def _wait(procs: list[tuple[subprocess.Popen, Any]], timeout_s: float) -> None:
    """Wait for every rank; once one fails, the others would hang in a collective, so stop them."""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            codes = [proc.poll() for proc, _ in procs]
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                break
            time.sleep(0.05)
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()


def _child(target: str, tmpdir: Path) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    module_name, function_name = target.split(":")
    function = getattr(importlib.import_module(module_name), function_name)
    payload = json.loads((tmpdir / "payload.json").read_text())
    try:
        result = function(rank, world_size, payload)
    except BaseException:
        traceback.print_exc()
        raise
    (tmpdir / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    _child(sys.argv[1], Path(sys.argv[2]))


# --- tiny models and generated data ------------------------------------------------------------------


def make_model(kind: str, *, seed: int = 0, sparse: bool = True):
    """`rec`: an MLP over two EmbeddingBags (sparse gradients when `sparse`); `cnn`: two convolutions and a head."""
    import torch
    from torch import nn

    class Rec(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.EmbeddingBag(24, 6, mode="sum", sparse=sparse)
            self.tags = nn.EmbeddingBag(16, 4, mode="sum", sparse=sparse)  # a second table: exchanges batch tables
            self.fc1 = nn.Linear(14, 12)
            self.fc2 = nn.Linear(12, 3)

        def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(torch.relu(self.fc1(torch.cat([self.emb(ids), self.tags(ids % 16), x], dim=1))))

    class CNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 4, 3)
            self.conv2 = nn.Conv2d(4, 6, 3)
            self.head = nn.Linear(6 * 4 * 4, 3)

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.conv2(torch.relu(self.conv1(images))))
            return self.head(h.flatten(1))

    torch.manual_seed(seed)
    return Rec() if kind == "rec" else CNN()


def make_batches(kind: str, *, steps: int, batch: int, seed: int = 1) -> list[tuple]:
    """Generated (inputs..., targets) per step; learnable targets so that training visibly lowers the loss."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        if kind == "rec":
            ids = torch.randint(0, 24, (batch, 3), generator=g)
            x = torch.randn(batch, 4, generator=g)
            y = ((ids[:, 0] % 3) + (x[:, 0] > 0).long()) % 3
            out.append((ids, x, y))
        else:
            images = torch.randn(batch, 1, 8, 8, generator=g)
            y = (images[:, 0, :4].mean(dim=(1, 2)) > 0).long() + (images[:, 0, 4:].mean(dim=(1, 2)) > 0).long()
            out.append((images, y))
    return out


def make_optimizer(name: str, params, *, lr: float | None = None):
    import torch

    if name == "sgd":
        return torch.optim.SGD(params, lr=lr or 0.1, momentum=0.9)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr or 0.1)
    return torch.optim.Adam(params, lr=lr or 0.01)


def loss_of(model, batch: tuple):
    import torch.nn.functional as F

    *inputs, y = batch
    return F.cross_entropy(model(*inputs), y)


def train(model, optimizer, batches: list[tuple], *, rank: int = 0, world_size: int = 1) -> list[float]:
    """Plain training; with world_size > 1 each rank takes its slice of every global batch."""
    from stratagem.runtime import local_batch

    losses = []
    for batch in batches:
        mine = tuple(local_batch(t, rank=rank, world_size=world_size) for t in batch)
        loss = loss_of(model, mine)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses


PARAMETER_SCALE_FLOOR = 1e-2
"""Parameters smaller than this (a normalization's bias a few steps from its zero init) are compared
against it instead: their values are sums with cancellation whose float32 rounding depends on the
reduction order (ranks against one process, one CPU's kernels against another's), so their own
magnitude would turn 1e-7 of rounding into a large relative error. A synchronization bug moves
parameters by the learning rate's order, far above it."""


def relative_error(got, want) -> float:
    """max|got - want| / max(max|want|, PARAMETER_SCALE_FLOOR)."""
    return float((got - want).abs().max() / want.abs().max().clamp_min(PARAMETER_SCALE_FLOOR))


def max_relative_error(model, reference) -> float:
    """Largest `relative_error` over the parameters."""
    ref = dict(reference.named_parameters())
    return max(relative_error(p.detach(), ref[name].detach()) for name, p in model.named_parameters())


# --- strategies ------------------------------------------------------------------------------------


def replicas(world_size: int, *, shared_node: bool = False) -> list[str]:
    """One fake node per rank, or (shared_node) ranks 0 and 1 on the first node: what local replication needs."""
    if shared_node:
        return [f"10.0.0.1:CPU:{i}" for i in range(min(2, world_size))] + [
            f"10.0.0.{i}:CPU:0" for i in range(2, world_size)
        ]
    return [f"10.0.0.{i + 1}:CPU:0" for i in range(world_size)]


def servers(world_size: int, *, shared_node: bool = False) -> list[str]:
    nodes = sorted({d.rsplit(":", 2)[0] for d in replicas(world_size, shared_node=shared_node)})
    return [f"{n}:CPU:0" for n in nodes]


def ps(destination: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "ps", "reduction_destination": destination, **extra}


def strategy_variables(case: str, variables: list[tuple[str, list[int]]], world_size: int) -> tuple[list[dict], bool]:
    """Variable configs of a named test case, and whether its replicas share a node."""
    shared = case in ("ps_local_replication", "allreduce_hierarchical")
    srv = servers(world_size, shared_node=shared)
    configs = []
    for i, (name, shape) in enumerate(variables):
        configs.append({"var_name": name, **_case_config(case, i, shape, srv, world_size)})
    return configs, shared


def _case_config(case: str, i: int, shape: list[int], srv: list[str], world_size: int) -> dict[str, Any]:
    if case == "allreduce_groups":
        return {"synchronizer": {"kind": "allreduce", "group": i // 2}}
    if case == "allreduce_hierarchical":
        return {"synchronizer": {"kind": "allreduce", "algorithm": "hierarchical", "group": i // 3}}
    if case == "ps_single":
        return {"synchronizer": ps(srv[0])}
    if case == "ps_balanced":
        return {"synchronizer": ps(srv[i % len(srv)])}
    if case == "ps_local_replication":
        return {"synchronizer": ps(srv[i % len(srv)], local_replication=True)}
    if case == "sharded":
        return {"synchronizer": {"kind": "sharded", "group": i % 2}}
    if case == "ps_partitioned":
        return _partitioned(i, shape, srv)
    if case == "mixed":
        return _mixed(i, shape, srv)
    raise ValueError(case)


def _partitioned(i: int, shape: list[int], srv: list[str]) -> dict[str, Any]:
    axis = 1 if len(shape) >= 2 and i % 2 == 1 and shape[1] >= 2 else 0
    shards = min(len(srv) + (1 if axis == 0 else 0), shape[axis])
    if shards < 2:
        return {"synchronizer": ps(srv[i % len(srv)])}
    return {
        "synchronizer": ps(srv[0]),
        "partition": {"axis": axis, "shards": shards},
        "shard_synchronizers": [ps(srv[(i + j) % len(srv)]) for j in range(shards)],
    }


def _mixed(i: int, shape: list[int], srv: list[str]) -> dict[str, Any]:
    kind = i % 4
    if kind == 0:
        return {"synchronizer": {"kind": "allreduce", "group": 0}}
    if kind == 1 and shape[0] >= 2:
        return {
            "synchronizer": {"kind": "allreduce", "group": 1},
            "partition": {"axis": 0, "shards": 2},
            "shard_synchronizers": [{"kind": "allreduce", "group": 1}, ps(srv[-1])],
        }
    if kind == 2:
        return {"synchronizer": {"kind": "sharded", "group": 3}}
    return {"synchronizer": ps(srv[-1])}


def make_strategy(case: str, model, world_size: int, **extra: Any):
    from stratagem.ir import Strategy

    variables = [(n, list(p.shape)) for n, p in model.named_parameters()]
    configs, shared = strategy_variables(case, variables, world_size)
    return Strategy.parse({"replicas": replicas(world_size, shared_node=shared), "variables": configs, **extra})


class FakeMesh:
    """A tensor group of `degree` ranks as far as the checks can tell: they run before any collective."""

    def __init__(self, degree: int) -> None:
        self.degree = degree

    def size(self) -> int:
        return self.degree
