"""What zeros in the optimizer state cost an update on this CPU, a cost that depends on values.

Adam, Adagrad and RMSprop take the square root of their second-moment state every step. On this
project's machines (AMD EPYC, PyTorch's AVX-512 kernels) `torch.sqrt` of an exact zero costs several
times what it costs for any other value, so an entry whose gradient has always been zero makes the
update slower. Such entries are common: weights behind dead ReLU units (VGG's classifier in the
accuracy benchmark keeps about 45% of its Adam state at zero) and, early in training, every entry a
top-k compressor has not yet selected. The simulator prices an update by its bytes; a graph captured
on fake tensors carries no values, so this cost is not in the simulator (docs/simulator.md).

Measured side by side, in turns: `torch.sqrt` over ones and over zeros, and an Adam step over the same
16 MB of parameters whose gradients are zero at a given share of the entries (those entries' state
stays zero).

    python -m benchmarks.zero_state_update [--repeats 9]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

ELEMENTS = 4 << 20
ZERO_SHARES = (0.0, 0.45, 0.9, 1.0)


def _ms(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return 1e3 * (time.perf_counter() - start)


def _adam(zero_share: float, elements: int) -> Callable[[], object]:
    import torch

    generator = torch.Generator().manual_seed(0)
    param = torch.nn.Parameter(torch.randn(elements, generator=generator))
    param.grad = torch.randn(elements, generator=generator) * (torch.rand(elements, generator=generator) >= zero_share)
    optimizer = torch.optim.Adam([param])
    optimizer.step()
    return optimizer.step


def measure(repeats: int, elements: int = ELEMENTS) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    ones, zeros = torch.ones(elements), torch.zeros(elements)
    out = torch.empty(elements)
    runs: dict[str, Callable[[], object]] = {
        "sqrt_ones_ms": lambda: torch.sqrt(ones, out=out),
        "sqrt_zeros_ms": lambda: torch.sqrt(zeros, out=out),
        **{f"adam_zero_share_{share}_ms": _adam(share, elements) for share in ZERO_SHARES},
    }
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            samples[name].append(_ms(run))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    dense = medians["adam_zero_share_0.0_ms"]
    return {
        "elements": elements,
        **{name: round(value, 4) for name, value in medians.items()},
        "sqrt_zero_over_one": float(f"{medians['sqrt_zeros_ms'] / medians['sqrt_ones_ms']:.3g}"),
        "adam_slowdown": {
            str(share): round(medians[f"adam_zero_share_{share}_ms"] / dense, 2) for share in ZERO_SHARES
        },
        "ns_per_zero_state_entry": round(1e6 * (medians["adam_zero_share_1.0_ms"] - dense) / elements, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    print(json.dumps({"benchmark": "zero_state_update", **measure(args.repeats)}, indent=2))


if __name__ == "__main__":
    main()
