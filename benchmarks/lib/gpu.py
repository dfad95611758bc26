"""The one-GPU benchmarks' cases: zoo models at sizes a GPU computes in milliseconds, and the same step
in plain PyTorch (no Stratagem runtime), the reference a one-rank trial is set beside."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from stratagem import zoo

CASES: list[tuple[str, int, dict[str, Any]]] = [
    ("bert_large", 16, {"layers": 4, "hidden": 1024, "ffn": 4096, "seq": 128, "heads": 16}),
    ("gpt", 16, {"hidden": 1024, "ffn": 4096, "layers": 4, "seq": 256, "heads": 16}),
    ("vgg16", 64, {"width": 64, "hidden": 4096}),
    ("resnet50", 64, {"width": 64}),
    ("dlrm", 4096, {}),
]
"""Zoo models at sizes a GPU computes in milliseconds, each with its batch per step."""


def optimizer_for(name: str) -> str:
    return "adagrad" if name == "dlrm" else "adam"


def plain_model(
    name: str, batch: int, overrides: dict[str, Any]
) -> tuple[torch.nn.Module, torch.optim.Optimizer, tuple[Any, ...]]:
    """The zoo model on CUDA with its optimizer and one batch, in plain PyTorch (no Stratagem runtime)."""
    module, make_batch = zoo.build(name, "small", device="cuda", **overrides)
    optimizer = (torch.optim.Adagrad if optimizer_for(name) == "adagrad" else torch.optim.Adam)(module.parameters())
    return module, optimizer, make_batch(batch)


def plain_training(name: str, batch: int, overrides: dict[str, Any]) -> Callable[[], None]:
    """One training step of the zoo model on CUDA in plain PyTorch, as a user's own loop runs it."""
    module, optimizer, inputs = plain_model(name, batch, overrides)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        module(*inputs).backward()
        optimizer.step()

    return step


def plain_step_ms(name: str, batch: int, overrides: dict[str, Any], *, warmup: int = 10, steps: int = 20) -> float:
    step = plain_training(name, batch, overrides)
    times = []
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e3, 3)
