"""The graph of one replica's step, for a strategy that states its micro-batch size.

The engine reads a graph as a replica's whole step and splits its batch into the micro-batches. A
strategy with `micro_batch_size` (every strategy a layout builds: its graph is captured at the
micro-batch) trains `micro_batch_size × micro_batches` samples per replica per step instead, so it is
priced on the graph scaled to that step: every per-sample figure (FLOPs, activation and output bytes,
the bytes a layer moves beyond its weights, its element-wise kernels' bytes (eager, fused and under
autocast) and its fused attention calls, sparse lookups) times `step samples / graph batch`, the
variables as they are. Compute, activations and samples are linear in the batch for the layers a
graph records; the weights a layer reads are not, and stay.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from stratagem.bounded_cache import BoundedCache
from stratagem.ir import ModelGraph
from stratagem.ir.document import content_hash

if TYPE_CHECKING:
    from simulator.context import SimContext
    from simulator.encoding import CandidateBatch

CACHED = 16

_graphs: BoundedCache[tuple[str | None, int], ModelGraph] = BoundedCache(CACHED)


def step_graph(graph: ModelGraph, samples: int) -> ModelGraph:
    """`graph` scaled to `samples` per replica step (cached per graph and sample count)."""
    if samples == graph.batch_size:
        return graph
    return _graphs.get((graph.id, samples), lambda: _scaled(graph, samples))


def _scaled(graph: ModelGraph, samples: int) -> ModelGraph:
    factor = samples / graph.batch_size
    weights = {variable.name: variable.nbytes for variable in graph.variables}
    layers = []
    for layer in graph.layers:
        fixed = min(layer.bytes_moved, sum(weights[name] for name in layer.variables))
        layers.append(
            layer.model_copy(
                update={
                    "fwd_flops": layer.fwd_flops * factor,
                    "bwd_flops": layer.bwd_flops * factor,
                    "bytes_moved": (layer.bytes_moved - fixed) * factor + fixed,
                    "activation_bytes": layer.activation_bytes * factor,
                    "gpu_activation_bytes": None
                    if layer.gpu_activation_bytes is None
                    else layer.gpu_activation_bytes * factor,
                    "output_bytes": layer.output_bytes * factor,
                    "elementwise_bytes": layer.elementwise_bytes * factor,
                    "arithmetic_bytes": None
                    if layer.arithmetic_bytes is None
                    else _per_sample(layer.arithmetic_bytes, fixed, factor),
                    "fused_elementwise_bytes": None
                    if layer.fused_elementwise_bytes is None
                    else layer.fused_elementwise_bytes * factor,
                    "autocast_elementwise_bytes": None
                    if layer.autocast_elementwise_bytes is None
                    else layer.autocast_elementwise_bytes * factor,
                    "attention": None
                    if layer.attention is None
                    else layer.attention.model_copy(
                        update={
                            "flops": layer.attention.flops * factor,
                            "traced_bytes": layer.attention.traced_bytes * factor,
                            "io_bytes": layer.attention.io_bytes * factor,
                        }
                    ),
                }
            )
        )
    variables = [
        variable.model_copy(update={"lookups_per_step": round(variable.lookups_per_step * factor)})
        if variable.lookups_per_step is not None
        else variable
        for variable in graph.variables
    ]
    # Every figure above is a scaled copy of a validated one, so the graph is not validated again (on a
    # 300B decoder that costs more than pricing a search's first layouts); its id names the graph it
    # scales and the sample count, as it is never stored.
    derived = content_hash({"step_graph_of": graph.id, "samples": samples})
    return graph.model_copy(update={"batch_size": samples, "layers": layers, "variables": variables, "id": derived})


def step_samples(context: SimContext, batch: CandidateBatch) -> np.ndarray:
    """[N] samples each row's replica trains per step: `micro_batch_size × micro_batches` where the row
    states its micro-batch size, else the graph's batch."""
    stated = batch.micro_batch_size.astype(np.int64) * batch.micro_batches
    return np.where(batch.micro_batch_size > 0, stated, context.batch_size)


def step_context(context: SimContext, samples: int) -> SimContext:
    """`context` with its graph scaled to `samples` per replica step (cached on the context: a search
    prices a handful of step sizes, one per data degree under a fixed global batch)."""
    if samples == context.batch_size:
        return context
    found = context._steps.get(samples)
    if found is None:
        from simulator.context import compile_context

        found = compile_context(step_graph(context.graph, samples), context.resources)
        if len(context._steps) >= 4 * CACHED:
            context._steps.clear()
        context._steps[samples] = found
    return found


def _per_sample(moved: float, weights: float, factor: float) -> float:
    """Bytes of a figure that reads `weights` once whatever the batch, at `factor` times the batch."""
    fixed = min(moved, weights)
    return (moved - fixed) * factor + fixed
