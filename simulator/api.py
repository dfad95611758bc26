"""The convenience entry point: Strategies in, Predictions out, contexts cached per (graph, cluster)."""

from __future__ import annotations

import logging

from simulator.codec import check_all, encode
from simulator.context import SimContext, compile_context
from simulator.prediction import Prediction, predictions
from simulator.step_graph import step_graph
from stratagem.bounded_cache import BoundedCache
from stratagem.errors import InvalidDocumentError
from stratagem.ir import ModelGraph, ResourceSpec, Strategy

SIMULATOR_VERSION = "principled-1.31"
"""Bump when a formula changes: predictions (and learned corrections) record which simulator made them."""

log = logging.getLogger(__name__)

CACHE_SIZE = 8
_contexts: BoundedCache[tuple[str | None, str | None], SimContext] = BoundedCache(CACHE_SIZE)


def context_for(graph: ModelGraph, resources: ResourceSpec) -> SimContext:
    """A compiled context, reused while the same (graph id, resources id) keeps coming back."""
    return _contexts.get((graph.id, resources.id), lambda: compile_context(graph, resources))


def simulate(graph: ModelGraph, resources: ResourceSpec, strategies: list[Strategy]) -> list[Prediction]:
    """Predict each strategy. Raises InvalidStrategyError (with the strategy's index in the path) for a
    strategy that does not match the graph or cluster. A strategy that states its micro-batch size is
    priced on the graph of its whole step (`step_graph`), one batch per step size."""
    if not strategies:
        return []
    samples = [strategy.step_samples(graph.batch_size) for strategy in strategies]
    if all(n == graph.batch_size for n in samples):
        context = context_for(graph, resources)
        return predictions(context, encode(context, strategies))
    check_all(graph, resources, strategies)
    out: list[Prediction | None] = [None] * len(strategies)
    for size in sorted(set(samples)):
        rows = [i for i, n in enumerate(samples) if n == size]
        context = context_for(step_graph(graph, size), resources)
        batch = [strategies[i] for i in rows]
        for i, prediction in zip(rows, predictions(context, encode(context, batch, validate=False)), strict=True):
            out[i] = prediction
    return [p for p in out if p is not None]


def simulate_each(graph: ModelGraph, resources: ResourceSpec, strategies: list[Strategy]) -> list[Prediction | None]:
    """Like `simulate`, but one refused strategy does not sink the others: recorded trials and old
    candidates may predate a schema or runtime rule, and the rest of their batch is still worth
    predicting. None (and a warning) for each refused strategy; one batch when none is refused."""
    try:
        return list(simulate(graph, resources, strategies))
    except InvalidDocumentError:
        pass
    out: list[Prediction | None] = []
    for strategy in strategies:
        try:
            out.append(simulate(graph, resources, [strategy])[0])
        except InvalidDocumentError as error:
            log.warning("the simulator refuses strategy %s: %s", strategy.id, error)
            out.append(None)
    return out
