"""The bridge between a layout's graph (one micro-batch) and the simulator's (one replica's whole step).

A layout's graph is captured at the micro-batch, and its strategy runs `pipeline.micro_batches` of
them per step (DESIGN, "Layouts"). The simulator prices a strategy on a graph of the replica's whole
step and splits that graph's batch into the micro-batches, as the search and the runtime write and run
strategies. So `predict` prices a strategy built from a layout on the graph of its whole step: every
per-sample figure (FLOPs, activation and output bytes, the bytes a layer moves beyond its weights,
sparse lookups) times the micro-batch count, the variables as they are.

`tests/test_predict.py::test_the_simulator_splits_the_graphs_batch_into_micro_batches` pins the
simulator's side of this; when the simulator reads the graph at the micro-batch, that test fails and
this module goes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from stratagem.ir import ModelGraph, Strategy

LAYOUT_BUILDER = "Layout"
"""`provenance.builder` of a strategy `Layout.build` wrote: its graph is one micro-batch."""
CACHED = 16

_graphs: OrderedDict[tuple[str | None, int], ModelGraph] = OrderedDict()
_lock = threading.Lock()


def micro_batch_count(strategy: Strategy) -> int:
    """How many micro-batches of its graph a layout's strategy runs per step; 1 for other strategies,
    whose graph is already the replica's step."""
    if strategy.provenance.builder != LAYOUT_BUILDER or strategy.pipeline is None:
        return 1
    return strategy.pipeline.micro_batches


def step_graph(graph: ModelGraph, micro_batches: int) -> ModelGraph:
    """The graph of `micro_batches` micro-batches of `graph` (cached per graph and count)."""
    if micro_batches == 1:
        return graph
    key = (graph.id, micro_batches)
    with _lock:
        found = _graphs.get(key)
    if found is not None:
        return found
    scaled = _scaled(graph, micro_batches)
    with _lock:
        _graphs[key] = scaled
        while len(_graphs) > CACHED:
            _graphs.popitem(last=False)
    return scaled


def _scaled(graph: ModelGraph, factor: int) -> ModelGraph:
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
                    "output_bytes": layer.output_bytes * factor,
                }
            )
        )
    variables = [
        variable.model_copy(update={"lookups_per_step": variable.lookups_per_step * factor})
        if variable.lookups_per_step is not None
        else variable
        for variable in graph.variables
    ]
    return graph.replace(batch_size=graph.batch_size * factor, layers=layers, variables=variables)
