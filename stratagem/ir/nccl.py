"""NCCL's own cost model constants (NVIDIA/nccl@5067397c, `src/graph/tuning.cc`), the figures of the library
GPU ranks reduce through. The simulator prices collectives with them (`simulator.collectives`), and
`stratagem calibrate --gpu` inverts the same model to describe a node's link from a measured sweep
(`stratagem.calibrate.links`), so a measured link prices back to what was measured.

Protocols are indexed LL (0), LL128 (1), Simple (2).
"""

from __future__ import annotations

LL, LL128, SIMPLE = 0, 1, 2
PROTOCOLS = ("LL", "LL128", "Simple")
BASE_LATENCY_US: dict[str, tuple[float, float, float]] = {"ring": (6.6, 14.0, 8.4), "tree": (6.8, 14.0, 8.4)}
"""NCCL's fixed cost per collective launch, per protocol (`baseLatencies`)."""
STEP_LATENCY_US: dict[str, dict[str, tuple[float, float, float] | float]] = {
    "nvlink": {"ring": (0.6, 1.9, 3.4), "tree": (0.6, 1.25, 4.0), "nvls": 25.0},
    "pcie": {"ring": (1.0, 2.5, 5.7), "tree": (1.0, 1.9, 4.0), "nvls": 0.0},
    "net": {"ring": (2.7, 4.0, 14.0), "tree": (5.0, 8.5, 14.0), "nvls": 0.0},
}
"""NCCL's latency of one step per link class, algorithm and protocol (`hwLatencies`); the Simple ring step
is what a link's `latency_us` states, the others scale with it."""
RING_EFFICIENCY = (0.5, 0.92, 1.0)
"""Bus bandwidth of a ring per protocol over the link's (LL `busBw * .5`, LL128 `* 0.92`)."""
TREE_EFFICIENCY = 0.92
"""A tree all-reduce's bus bandwidth over the link's (`busBw * .92`)."""
TREE_PROTOCOL = (1.0 / 3.8, 7.0 / 9.0, 120.0 / 128.0, 1.0)
"""A tree's LL, LL128 inside one node, LL128 across nodes, and Simple factors."""


def step_ratio(link: str, algorithm: str, protocol: int) -> float:
    """One step of `algorithm` under `protocol` on `link` over one Simple ring step on it."""
    table = STEP_LATENCY_US[link]
    step = table[algorithm]
    return (step if isinstance(step, float) else step[protocol]) / table["ring"][SIMPLE]  # type: ignore[index]
