"""Every pre-built strategy simulates to a finite, explained prediction, and round-trips the encoding."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sample_documents import make_awkward_graph, make_embedding_graph, make_mlp_graph, make_t4_cluster

from simulator import BREAKDOWN_KEYS, compile_context, encode, simulate, simulate_batch, simulate_each, to_strategy
from stratagem.builders import all_builders
from stratagem.errors import InvalidStrategyError

GRAPHS = {"mlp": make_mlp_graph, "embedding": make_embedding_graph, "awkward": make_awkward_graph}


@pytest.mark.parametrize("graph_name", sorted(GRAPHS))
def test_every_builder_strategy_simulates_to_a_finite_step_time(graph_name):
    graph, spec = GRAPHS[graph_name](), make_t4_cluster(2)
    builders = all_builders()
    strategies = [builder.build(graph, spec) for builder in builders]
    predictions = simulate(graph, spec, strategies)
    for builder, prediction in zip(builders, predictions, strict=True):
        assert math.isfinite(prediction.step_time_s) and prediction.step_time_s > 0, builder.name
        assert prediction.samples_per_s > 0 and prediction.bottleneck, builder.name
        assert sum(prediction.breakdown.values()) == pytest.approx(prediction.step_time_s, rel=1e-9)
        assert set(prediction.breakdown) == set(BREAKDOWN_KEYS)


def test_builder_strategies_survive_encode_decode():
    graph, spec = make_embedding_graph(), make_t4_cluster(2)
    context = compile_context(graph, spec)
    strategies = [builder.build(graph, spec) for builder in all_builders()]
    batch = encode(context, strategies)
    decoded = [to_strategy(context, batch, i) for i in range(len(batch))]
    for original, again in zip(strategies, decoded, strict=True):
        again.validate_for(graph, spec)
        assert {c.var_name: [s.kind for s in c.synchronizers] for c in again.variables} == {
            c.var_name: [s.kind for s in c.synchronizers] for c in original.variables
        }
    np.testing.assert_array_equal(
        simulate_batch(context, encode(context, decoded)).step_time, simulate_batch(context, batch).step_time
    )


def test_a_strategy_for_another_graph_is_refused_with_its_index_and_field():
    graph, spec = make_mlp_graph(), make_t4_cluster(2)
    good = all_builders()[0].build(graph, spec)
    bad = good.replace(
        variables=[
            c.model_dump() | {"var_name": "nope"} if i == 0 else c.model_dump() for i, c in enumerate(good.variables)
        ]
    )
    with pytest.raises(InvalidStrategyError, match=r"strategies\[1\]\.variables\[0\]\.var_name"):
        simulate(graph, spec, [good, bad])


def test_simulate_each_predicts_the_rest_of_a_batch_and_marks_the_refused_one(caplog: pytest.LogCaptureFixture):
    graph, spec = make_mlp_graph(), make_t4_cluster(2)
    good = all_builders()[0].build(graph, spec)
    bad = good.replace(
        variables=[
            c.model_dump() | {"var_name": "nope"} if i == 0 else c.model_dump() for i, c in enumerate(good.variables)
        ]
    )
    first, refused, last = simulate_each(graph, spec, [good, bad, good])
    assert refused is None and "nope" in caplog.text
    assert first is not None and last is not None
    assert first.step_time_s == last.step_time_s == simulate(graph, spec, [good])[0].step_time_s


def test_a_broken_batch_is_refused_naming_the_array_and_entry():
    graph, spec = make_mlp_graph(), make_t4_cluster(2)
    context = compile_context(graph, spec)
    batch = encode(context, [all_builders()[0].build(graph, spec)])
    batch.group[0, 1] = context.num_variables + 3
    with pytest.raises(InvalidStrategyError, match=r"batch\.group\[0, 1\]"):
        simulate_batch(context, batch, validate=True)
