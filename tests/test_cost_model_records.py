"""Training records: summaries of real documents, JSON Lines that round-trip, errors that name the line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simulator.learned import InvalidRecordError, TrainingRecord, make_record, read_jsonl, write_jsonl
from simulator.learned.summaries import summarize_graph, summarize_resources, summarize_strategy
from simulator.learned.synthetic import synthetic_records
from stratagem.ir import ModelGraph, PredictedPerformance, ResourceSpec, Strategy


@pytest.fixture(scope="module")
def graph() -> ModelGraph:
    return ModelGraph.parse(
        {
            "name": "tiny",
            "batch_size": 8,
            "layers": [
                {
                    "name": "emb",
                    "kind": "embedding",
                    "fwd_flops": 0,
                    "variables": ["emb.weight"],
                    "activation_bytes": 100,
                },
                {
                    "name": "fc",
                    "kind": "matmul",
                    "fwd_flops": 1e6,
                    "bwd_flops": 2e6,
                    "inputs": ["emb"],
                    "variables": ["fc.weight"],
                },
            ],
            "variables": [
                {"name": "emb.weight", "shape": [1000, 4], "sparse": True, "lookups_per_step": 10, "consumer": "emb"},
                {"name": "fc.weight", "shape": [100, 10], "consumer": "fc"},
            ],
        }
    )


@pytest.fixture(scope="module")
def resources() -> ResourceSpec:
    return ResourceSpec.parse(
        {
            "nodes": [
                {"address": "10.0.0.1", "chief": True, "gpus": [0, 1], "device": "T4"},
                {"address": "10.0.0.2", "gpus": [0, 1], "device": "T4"},
            ],
            "network": {"bandwidth_gbps": 50},
        }
    )


@pytest.fixture(scope="module")
def strategy(graph: ModelGraph, resources: ResourceSpec) -> Strategy:
    ps = lambda host: {"kind": "ps", "reduction_destination": f"{host}:CPU:0", "local_replication": True}  # noqa: E731
    return Strategy.parse(
        {
            "graph_id": graph.id,
            "replicas": resources.compute_devices,
            "variables": [
                {
                    "var_name": "emb.weight",
                    "synchronizer": ps("10.0.0.1"),
                    "partition": {"axis": 0, "shards": 2},
                    "shard_synchronizers": [ps("10.0.0.1"), ps("10.0.0.2")],
                },
                {
                    "var_name": "fc.weight",
                    "synchronizer": {"kind": "allreduce", "group": 3, "compressor": {"kind": "fp16"}},
                },
            ],
        }
    )


def test_strategy_summary_counts_bytes_by_synchronizer(graph, strategy):
    summary = summarize_strategy(strategy, graph)
    # emb: 1000*4*4 = 16000 bytes on two servers; fc: 100*10*4 = 4000 bytes all-reduced with fp16.
    assert summary.ps_fraction == pytest.approx(0.8)
    assert summary.allreduce_fraction == pytest.approx(0.2)
    assert summary.compressed_fraction == 1.0 and summary.local_replication_fraction == 1.0
    assert summary.num_shards == 3 and summary.num_partitioned == 1 and summary.num_groups == 1
    assert summary.num_ps_servers == 2 and summary.max_server_share == pytest.approx(0.5)
    assert summary.data_degree == 4


def test_graph_and_cluster_summaries(graph, resources):
    g = summarize_graph(graph)
    assert g.num_parameters == 5000 and g.flops_per_step == 3e6 and g.sparse_share == pytest.approx(0.8)
    c = summarize_resources(resources)
    assert c.num_devices == 4 and c.num_nodes == 2 and c.device_code == 1
    assert c.min_bandwidth_bytes_per_s == pytest.approx(50e9 / 8 * 0.85), "the NIC is the slowest link"
    assert c.max_bandwidth_bytes_per_s > c.min_bandwidth_bytes_per_s


def test_a_record_from_documents_round_trips_through_json_lines(graph, resources, strategy, tmp_path):
    predicted = PredictedPerformance(
        step_time_s=0.25, samples_per_s=128, memory_per_device_bytes=1e9, breakdown={"compute": 0.2, "exposed_ps": 0.05}
    )
    record = make_record(graph, resources, strategy, predicted, measured_step_time_s=0.3, source="test")
    assert record.group_id.startswith(str(graph.id)[:16]) and record.strategy_id == strategy.id
    assert record.memory_per_device_bytes == 1e9
    path = tmp_path / "trials.jsonl"
    records = [record, *synthetic_records(n_groups=2, per_group=2)]
    assert write_jsonl(records, path) == 5
    assert read_jsonl(path) == records


def test_a_bad_line_is_reported_with_its_number_and_field(tmp_path):
    good = synthetic_records(n_groups=1, per_group=1)[0]
    broken = good.model_dump(mode="json")
    broken["measured_step_time_s"] = -1
    del broken["graph"]["batch_size"]
    path = tmp_path / "trials.jsonl"
    path.write_text("\n".join([good.model_dump_json(), "", json.dumps(broken), "{oops"]) + "\n")
    with pytest.raises(InvalidRecordError) as caught:
        read_jsonl(path)
    message = str(caught.value)
    assert "line 3: graph.batch_size" in message and "line 3: measured_step_time_s" in message
    assert "line 4: not JSON" in message


def test_records_refuse_unknown_fields_and_versions():
    data = synthetic_records(n_groups=1, per_group=1)[0].model_dump(mode="json")
    with pytest.raises(InvalidRecordError, match="surprise"):
        TrainingRecord.parse({**data, "surprise": 1})
    with pytest.raises(InvalidRecordError, match="schema_version"):
        TrainingRecord.parse({**data, "schema_version": "9"})


def test_records_from_the_real_simulator_train_a_model(graph, resources):
    """The whole path the service takes: builders -> simulate -> records -> fit -> corrected intervals."""
    import simulator
    from simulator.learned import CostModel
    from stratagem.builders import all_builders

    strategies = [builder.build(graph, resources) for builder in all_builders()]
    predictions = simulator.simulate(graph, resources, strategies)
    records = [
        # a stand-in measurement, not a real one: twice the simulated time, so the fitted correction is known
        make_record(graph, resources, s, p, measured_step_time_s=2 * p.step_time_s, group_id=f"job-{i % 3}")
        for i, (s, p) in enumerate(zip(strategies, predictions, strict=True))
    ]
    assert set(records[0].breakdown) == set(simulator.BREAKDOWN_KEYS)
    assert any(r.server_load_s for r in records), "PS builders put load on the servers"
    model = CostModel(n_estimators=200, n_bootstrap=2, reg_lambda=0.0, min_child_weight=1.0).fit(records)
    low, mid, high = model.predict_interval(records)
    simulated = np.array([p.step_time_s for p in predictions])
    assert np.allclose(mid / simulated, 2.0, rtol=0.05)
    assert np.all(low < mid) and np.all(mid < high)
