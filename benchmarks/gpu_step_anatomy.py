"""Where a one-rank GPU step of each zoo model in `benchmarks/gpu_one_rank.py` spends its time: the
forward, backward and optimizer phases each timed to the device's completion, against the plain step
(one wait at its end, so the host runs ahead of the device), and per layer kind what a layer pass
costs beyond its arithmetic (a chain of 64 tiny layers against one of 8, as the calibration's
`layer_overhead_s` probe does for Linear). With `--profile MODEL`, the operators that take the most
host time in one step of that model. Needs CUDA; prints one JSON object.

It answers what the simulator's GPU pricing leaves out: whether host launches and device kernels add
or overlap, whether other layer kinds cost what a Linear layer does per pass, and where a model the
calibrated simulator misprices (DLRM's sparse tables and Adagrad) spends its step.

    python -m benchmarks.gpu_step_anatomy [--profile dlrm]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from benchmarks.lib.gpu import CASES, plain_model, plain_training

STEPS = 15


def _synced(run: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    run()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def phases(name: str, batch: int, overrides: dict[str, Any]) -> dict[str, Any]:
    """Median milliseconds of each phase timed alone, of the plain step, and the host's share."""
    module, optimizer, inputs = plain_model(name, batch, overrides)
    held: dict[str, Any] = {}

    def forward() -> None:
        optimizer.zero_grad(set_to_none=True)
        held["loss"] = module(*inputs)

    def plain() -> None:
        forward()
        held["loss"].backward()
        optimizer.step()

    for _ in range(5):
        _synced(plain)
    samples: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": [], "step": [], "step_host": []}
    for _ in range(STEPS):
        samples["forward"].append(_synced(forward))
        samples["backward"].append(_synced(lambda: held["loss"].backward()))
        samples["optimizer"].append(_synced(optimizer.step))
        samples["step"].append(_synced(plain))
        torch.cuda.synchronize()
        start = time.perf_counter()
        plain()
        samples["step_host"].append(time.perf_counter() - start)
        torch.cuda.synchronize()
    out = {key: round(statistics.median(values) * 1e3, 3) for key, values in samples.items()}
    out["phases_sum"] = round(out["forward"] + out["backward"] + out["optimizer"], 3)
    return {"model": name, "batch": batch, **out}


def layer_pass_seconds(make: Callable[[], nn.Module], x: torch.Tensor) -> float:
    """(64-layer chain - 8-layer chain) / (2 passes x 56 layers), forward and backward."""

    def timed(layers: int) -> float:
        chain = nn.Sequential(*[make() for _ in range(layers)]).cuda()
        source = x.clone().requires_grad_(True)

        def step() -> None:
            chain(source).sum().backward()

        for _ in range(5):
            _synced(step)
        return statistics.median(_synced(step) for _ in range(21))

    return (timed(64) - timed(8)) / (2 * 56)


def layer_kinds() -> dict[str, float]:
    """Microseconds per layer pass of each kind, on inputs too small for arithmetic to matter."""
    tokens, images = torch.randn(8, 16, device="cuda"), torch.randn(2, 4, 8, 8, device="cuda")
    kinds: dict[str, tuple[Callable[[], nn.Module], torch.Tensor]] = {
        "linear": (lambda: nn.Linear(16, 16), tokens),
        "layer_norm": (lambda: nn.LayerNorm(16), tokens),
        "gelu": (nn.GELU, tokens),
        "dropout": (lambda: nn.Dropout(0.1), tokens),
        "conv3x3": (lambda: nn.Conv2d(4, 4, 3, padding=1), images),
        "batch_norm": (lambda: nn.BatchNorm2d(4), images),
        "relu": (nn.ReLU, images),
    }
    return {kind: round(layer_pass_seconds(make, x) * 1e6, 2) for kind, (make, x) in kinds.items()}


def profile(name: str) -> list[dict[str, Any]]:
    """The operators with the most host time in one step (after warm-up)."""
    batch, overrides = next((b, o) for n, b, o in CASES if n == name)
    step = plain_training(name, batch, overrides)
    for _ in range(5):
        _synced(step)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        _synced(step)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:20]
    return [
        {
            "op": e.key,
            "calls": e.count,
            "self_cpu_us": round(e.self_cpu_time_total, 1),
            "device_us": round(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)), 1),
        }
        for e in events
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=[name for name, _, _ in CASES], action="append", default=[])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_step_anatomy needs a CUDA device")
    report = {
        "benchmark": "gpu_step_anatomy",
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "layer_pass_us": layer_kinds(),
        "models": [phases(name, batch, overrides) for name, batch, overrides in CASES],
        "profiles": {name: profile(name) for name in args.profile},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
