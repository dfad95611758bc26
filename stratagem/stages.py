"""Pipeline stage cuts for a layout: contiguous chunks of the graph's layers, balanced by compute.

Cuts fall where the runtime can cut (`stratagem.parallel_rules`): at the beginning of a numbered block
(`blocks.3`, `model.layers.3`, `h.3`) when the graph has such blocks, so embeddings stay in the first
chunk and the final norm, head and loss in the last (`block_cuts` accepts every cut made here);
otherwise between the top-level children of the model (an `nn.Sequential`). Each chunk gets a share of
the forward + backward FLOPs as near equal as those places allow, and at least one block or child.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stratagem.errors import InvalidLayoutError, Problem
from stratagem.ir import ModelGraph
from stratagem.parallel_rules import block_of


def cut_points(graph: ModelGraph) -> list[int]:
    """Indices of the layers a later chunk may begin with, in order (never 0)."""
    names = [layer.name for layer in graph.layers]
    blocks = [block_of(name) for name in names]
    if any(block is not None for block in blocks):
        return _block_starts(blocks)
    units = [_top_level(name) for name in names]
    starts, current = [], units[0]
    for i, unit in enumerate(units):
        if unit is not None and unit != current:
            starts.append(i)
        current = unit if unit is not None else current
    return [i for i in starts if i > 0]


def _block_starts(blocks: list[str | None]) -> list[int]:
    """The first layer of each block, where no block begun before it has layers after it."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, block in enumerate(blocks):
        if block is not None:
            first.setdefault(block, i)
            last[block] = i
    starts, reach = [], -1
    for block, start in sorted(first.items(), key=lambda item: item[1]):
        if start > 0 and reach < start:
            starts.append(start)
        reach = max(reach, last[block])
    return starts


def _top_level(name: str) -> str | None:
    """The top-level child a layer belongs to; None for the model's own operations and the loss."""
    head = name.split("/")[0]
    if head.startswith("<"):
        return None
    return head.split(".")[0].split("#")[0]


def cut_stages(graph: ModelGraph, chunks: int, *, points: list[int] | None = None) -> list[list[str]]:
    """`chunks` contiguous lists of layer names covering the graph in order, balanced by compute
    (`points`: the graph's `cut_points`, when the caller has them already)."""
    names = [layer.name for layer in graph.layers]
    if chunks <= 1:
        return [names]
    points = cut_points(graph) if points is None else points
    if len(points) + 1 < chunks:
        raise InvalidLayoutError(
            [
                Problem(
                    "pipeline",
                    f"{chunks} pipeline chunks but the graph can be cut in only {len(points) + 1} places "
                    "(at the beginning of its numbered blocks, or between its top-level children)",
                )
            ]
        )
    work = np.array([layer.fwd_flops + layer.bwd_flops for layer in graph.layers], dtype=np.float64)
    if work.sum() <= 0:
        work = np.ones(len(names))
    bounds = [0, *balanced_cuts(work, points, chunks), len(names)]
    return [names[bounds[s] : bounds[s + 1]] for s in range(chunks)]


def balanced_cuts(work: np.ndarray, points: Sequence[int] | np.ndarray, chunks: int, *, first: int = 0) -> list[int]:
    """The `chunks` - 1 cut points (layer indices) of `points[first:]` nearest to equal shares of the
    per-layer `work`, in order, each later than the one before and leaving every chunk a point."""
    before = np.concatenate([[0.0], np.cumsum(work)])[np.asarray(points)]
    total = float(work.sum())
    cuts: list[int] = []
    low = first
    for k in range(1, chunks):
        high = len(points) - (chunks - k)
        index = int(np.clip(np.argmin(np.abs(before - k * total / chunks)), low, high))
        cuts.append(int(points[index]))
        low = index + 1
    return cuts
