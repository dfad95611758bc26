"""Simulator accuracy on CPU ranks: the scoring and record machinery of the accuracy benchmark
(on synthetic records, no timing), how calibrated figures become a device kind, and the CPU figures'
effect on predictions (convolution and optimizer efficiency, compute/communication overlap)."""

from __future__ import annotations

import gzip
import json
import lzma

import numpy as np
import pytest
from sample_documents import make_embedding_graph, make_loopback_cpus, make_mlp_graph

from benchmarks.lib.records import Measured, Trial, read_records, record_line
from benchmarks.lib.scoring import (
    accuracy_report,
    discordant_pairs,
    load_adjusted,
    load_adjusted_report,
    noise_report,
    predict,
    resolved_pairs,
    sign_test_p,
    split_half_tau,
)
from simulator import compile_context, encode, simulate, simulate_batch
from simulator.ps import SPARSE_CHANGED_ROWS_COALESCES
from simulator.variables import ADAPTIVE_SPARSE_STEP_COALESCES, COALESCE_PROBE_ROW_BYTES, SPARSE_STEP_COALESCES
from stratagem.builders import PS, AllReduce, PartitionedPS
from stratagem.calibrate.figures import (
    DEVICE_KIND,
    LOWRANK_MATRIX_BYTES,
    OPTIMIZER_TENSOR_BYTES,
    SHARED_CORE_LATENCY_CONTENTION,
    SHARED_CORE_OVERLAP,
    combine,
    device_spec,
    optimizer_size_law,
    size_law,
)
from stratagem.ir import DeviceSpec, Layer, Link, ModelGraph, Node, ResourceSpec, Strategy, Variable


def cpu_spec(**device: float | None) -> ResourceSpec:
    """Two CPU ranks on loopback, with a device kind whose figures the test sets."""
    figures = {
        "peak_flops": {"float32": 50e9},
        "memory_bytes": 8e9,
        "memory_bandwidth": 8e9,
        "matmul_efficiency": 1.0,
        "elementwise_efficiency": 0.5,
        "launch_overhead_s": 20e-6,
        "is_gpu": False,
        **device,
    }
    return make_loopback_cpus("cpu-test", DeviceSpec(name="CPU", **figures), bandwidth_gbps=4.0)


# -- metrics and records --------------------------------------------------------------------------------


def test_records_round_trip_into_pairs_with_rounds_and_failures(tmp_path):
    graph, resources = make_mlp_graph(), cpu_spec()
    strategies = [AllReduce().build(graph, resources), PS().build(graph, resources)]
    lines = []
    for round_medians in ((0.10, 0.30), (0.12, 0.34), (0.11, None)):
        for strategy, median in zip(strategies, round_medians, strict=True):
            result = {"outcome": "ok", "median_s": median} if median else {"outcome": "hang", "median_s": None}
            lines.append(record_line(graph, resources, strategy, result))
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(lines) + "\n")
    first = json.loads(lines[0])
    assert set(first) == {"graph", "resources", "strategy", "result"}
    assert ResourceSpec.parse(first["resources"]).id == resources.id

    pairs = {p.name: p for p in read_records(path)}
    assert set(pairs) == {"AllReduce", "PS"}
    assert [t.median_s for t in pairs["AllReduce"].trials] == [0.10, 0.12, 0.11]
    assert pairs["AllReduce"].measured == pytest.approx(0.11)
    assert [t.median_s for t in pairs["PS"].trials] == [0.30, 0.34, None] and pairs["PS"].trials[2].failure == "hang"
    assert pairs["PS"].spread == pytest.approx(0.04 / 0.32)
    assert all(t.resources.id == resources.id for p in pairs.values() for t in p.trials)

    predict(list(pairs.values()))
    expected = simulate(graph, resources, strategies)
    assert pairs["AllReduce"].predicted == pytest.approx(expected[0].step_time_s)
    assert pairs["PS"].trials[2].predicted_s == pytest.approx(expected[1].step_time_s)
    report = accuracy_report(list(pairs.values()))
    assert report["overall"]["n"] == 2 and report["models"]["mlp"]["n"] == 2
    errors = [abs(p.predicted - p.measured) / p.measured for p in pairs.values()]
    assert report["overall"]["mape"] == pytest.approx(sum(errors) / 2, abs=1e-4)


@pytest.mark.parametrize("suffix, compress", [(".xz", lzma.compress), (".gz", gzip.compress)])
def test_compressed_records_read_as_the_plain_file(tmp_path, suffix, compress):
    graph, resources = make_mlp_graph(), cpu_spec()
    strategy = AllReduce().build(graph, resources)
    text = "".join(record_line(graph, resources, strategy, {"outcome": "ok", "median_s": m}) + "\n" for m in (0.1, 0.2))
    plain, packed = tmp_path / "records.jsonl", tmp_path / f"records.jsonl{suffix}"
    plain.write_text(text)
    packed.write_bytes(compress(text.encode()))

    assert packed.stat().st_size < plain.stat().st_size
    [expected], [got] = read_records(plain), read_records(packed)
    assert [t.median_s for t in got.trials] == [t.median_s for t in expected.trials] == [0.1, 0.2]
    assert got.graph.id == expected.graph.id and got.name == expected.name == "AllReduce"


def test_report_scores_ranking_within_each_model_and_pooled():
    graph = make_mlp_graph()

    def pair(model: str, measured: float, predicted: float):
        trials = [Trial(cpu_spec(), None, measured, predicted_s=predicted) for _ in range(2)]
        return Measured(model, f"{model}-{measured}", graph, trials)

    # model a: ranked right, 10% off; model b: ranked backwards, exact on average
    pairs = [
        pair("a", 1.0, 1.1),
        pair("a", 2.0, 2.2),
        pair("a", 3.0, 3.3),
        pair("b", 10.0, 12.0),
        pair("b", 12.0, 10.0),
    ]
    report = accuracy_report(pairs)
    assert report["models"]["a"] == {"n": 3, "mape": pytest.approx(0.1), "kendall_tau": pytest.approx(1.0)}
    assert report["models"]["b"]["kendall_tau"] == pytest.approx(-1.0)
    assert report["overall"]["kendall_tau_within"] == pytest.approx(0.0)
    assert report["overall"]["kendall_tau"] > 0.5  # pooled: the models' scales dominate
    assert report["overall"]["meets_targets"] is False
    assert noise_report(pairs)["median_round_spread"] == 0.0


def test_split_half_tau_ranks_the_even_rounds_against_the_odd_ones():
    graph = make_mlp_graph()

    def pair(name: str, rounds: list[float]):
        return Measured("m", name, graph, [Trial(cpu_spec(), None, t) for t in rounds])

    # even rounds (1st, 3rd) rank x < y < z; odd rounds (2nd, 4th) rank y < x < z
    members = [pair("x", [1.0, 2.0, 1.0, 2.0]), pair("y", [1.5, 1.0, 1.5, 1.0]), pair("z", [3.0, 3.0, 3.0, 3.0])]
    assert split_half_tau(members) == pytest.approx(1 / 3)
    assert split_half_tau([pair("x", [1.0]), pair("y", [2.0])]) is None  # one round: nothing to split
    assert noise_report(members)["kendall_tau_split_half_within"] == pytest.approx(1 / 3, abs=1e-4)


def test_load_adjustment_divides_out_what_moved_a_whole_block():
    graph = make_mlp_graph()
    blocks = [cpu_spec(launch_overhead_s=20e-6 * (i + 1)) for i in range(4)]
    assert len({b.id for b in blocks}) == 4
    load = [1.0, 2.0, 1.0, 4.0]  # the machine's drift: every strategy in block 2 and 4 ran slower alike

    def pair(name: str, base: float, jitter: list[float]):
        trials = [Trial(spec, None, base * factor * j) for spec, factor, j in zip(blocks, load, jitter, strict=True)]
        return Measured("m", name, graph, trials)

    members = [
        pair("x", 1.0, [1.0, 1.0, 1.0, 1.0]),
        pair("y", 1.5, [1.0, 1.0, 1.0, 1.0]),
        pair("z", 3.0, [1.0, 1.0, 1.0, 1.0]),
    ]
    adjusted = load_adjusted(members)
    for before, after, base in zip(members, adjusted, (1.0, 1.5, 3.0), strict=True):
        times = [t.median_s for t in after.trials]
        assert max(times) == pytest.approx(min(times))  # the drift is gone ...
        assert after.measured == pytest.approx(base * 1.5)  # ... at the job's median load (1.5)
        assert after.spread == pytest.approx(0.0, abs=1e-9) and before.spread > 1
    report = load_adjusted_report(members)
    assert report["noise"]["median_round_spread"] == pytest.approx(0.0, abs=1e-4)
    one_block = [Measured("m", "x", graph, [Trial(blocks[0], None, 1.0)])]
    assert load_adjusted(one_block)[0].trials[0].median_s == 1.0  # one block: nothing to divide


def test_discordant_pairs_tell_systematic_misses_from_coin_flips():
    graph = make_mlp_graph()

    def pair(name: str, rounds: list[float], predicted: float) -> object:
        trials = [Trial(cpu_spec(), None, t, predicted_s=predicted) for t in rounds]
        return Measured("m", name, graph, trials)

    # x beats y in 4 of 4 rounds and z in 2 of 4; the prediction puts x last
    members = [
        pair("x", [1.0, 1.0, 1.0, 1.0], 3.0),
        pair("y", [2.0, 2.0, 2.0, 2.0], 2.0),
        pair("z", [0.9, 1.1, 0.95, 1.15], 1.0),
    ]
    found = {(d["faster"], d["slower"]): d for d in discordant_pairs(members)}
    assert set(found) == {("x", "y"), ("x", "z")}  # z's median is 1.025, so x is measured faster than both
    assert found[("x", "y")]["rounds_agreeing"] == 1.0 and found[("x", "y")]["systematic"]
    assert found[("x", "z")]["rounds_agreeing"] == 0.5 and not found[("x", "z")]["systematic"]


def test_sign_test_matches_the_binomial_tails():
    assert sign_test_p(8, 8) == pytest.approx(2 / 256)  # every round agreeing: p = 0.0078
    assert sign_test_p(1, 8) == pytest.approx(2 * 9 / 256)  # 7 of 8: p = 0.07, not resolved at 0.05
    assert sign_test_p(4, 8) == 1.0 and sign_test_p(0, 0) == 1.0


def test_resolved_pairs_score_only_the_order_the_rounds_establish():
    rounds = {
        "m": {
            "fast": ([1.0] * 8, [1.5] * 8),
            "slow": ([2.0] * 8, [2.0] * 8),
            "tied": ([4.0, 4.0, None, 4.0, 4.0, 4.0, 4.0, 4.0], [2.0] * 8),  # priced as "slow": ordered neither way
            "miss": ([1.5] * 8, [0.5] * 8),  # measured slower than "fast" in every round, priced faster
            "coin": ([0.5, 3.0] * 4, [1.0] * 8),  # beats fast, slow and miss in half the rounds: unresolved
        }
    }
    # resolved: fast-slow, fast-tied, slow-miss, tied-miss, tied-coin (coin faster in 7 of 7) right;
    # fast-miss wrong; slow-tied priced equal
    report = resolved_pairs(rounds)
    assert report["models"]["m"] == {
        "pairs": 10,
        "resolved": 7,
        "ordered_right": 5,
        "ordered_wrong": 1,
        "kendall_tau_resolved": pytest.approx(4 / 7, abs=1e-4),
    }
    assert report["overall"]["resolved"] == 7 and report["alpha"] == 0.05
    flat = ([1.0] * 8, [1.0] * 8)
    assert resolved_pairs({"m": {"a": flat, "b": flat}})["overall"]["kendall_tau_resolved"] is None


# -- calibration figures ----------------------------------------------------------------------------------


def calibrated(**figures: float) -> dict[str, float]:
    """One rank's calibration figures, as `stratagem.calibrate` records them, with `figures` in place."""
    return {
        "matmul_flops": 80e9,
        "bf16_flops": 300e9,
        "conv_flops": 40e9,
        "copy_bandwidth": 8e9,
        "elementwise_rate": 2e9,
        "norm_rate": 1e9,
        "optimizer_rate": 4e9,
        "layer_overhead_s": 30e-6,
        "overlap": 0.0,
        **figures,
    }


def test_calibrated_figures_become_efficiencies_of_the_measured_rates():
    figures = calibrated(optimizer_rate=12e9, overlap=-0.05, cast_rate=6e9, select_rate=0.08e9)
    device = device_spec(figures, memory_bytes=4e9)
    assert device.name == DEVICE_KIND and not device.is_gpu
    assert device.flops_for("float32") == 80e9 and device.matmul_efficiency == 1.0
    assert device.conv_efficiency == pytest.approx(0.5)
    assert device.elementwise_efficiency == pytest.approx(0.25)
    assert device.norm_efficiency == pytest.approx(0.125)
    assert device.optimizer_efficiency == 1.0  # faster than a copy is priced as a copy
    assert device.cast_efficiency == pytest.approx(0.75)
    assert device.select_efficiency == pytest.approx(0.01)
    assert device.comm_overlap == 0.0  # a slightly negative measured share means none
    assert device.launch_overhead_s == pytest.approx(30e-6)


def test_ranks_without_a_spare_core_take_the_shared_core_figures_instead_of_a_measured_overlap():
    figures = calibrated(overlap=0.4)
    shared = device_spec({**figures, "spare_cores": 0}, memory_bytes=4e9)
    assert (shared.comm_overlap, shared.comm_latency_contention) == (
        SHARED_CORE_OVERLAP,
        SHARED_CORE_LATENCY_CONTENTION,
    )
    spare = device_spec({**figures, "spare_cores": 2}, memory_bytes=4e9)
    assert (spare.comm_overlap, spare.comm_latency_contention) == (pytest.approx(0.4), 0.0)
    unrecorded = device_spec(figures, memory_bytes=4e9)  # an old calibration measured whatever it recorded
    assert (unrecorded.comm_overlap, unrecorded.comm_latency_contention) == (pytest.approx(0.4), 0.0)


def test_root_collectives_may_beat_the_all_reduce_bandwidth_and_tensor_costs_pass_through():
    figures = calibrated(reduce_efficiency=0.9, broadcast_efficiency=2.4, optimizer_tensor_s=25e-6)
    device = device_spec(figures, memory_bytes=4e9)
    assert device.reduce_efficiency == pytest.approx(0.9)
    assert device.broadcast_efficiency == pytest.approx(
        2.4
    )  # a broadcast does no arithmetic: faster than the all-reduce's fit
    assert device.optimizer_tensor_s == pytest.approx(25e-6)
    assert device_spec({**figures, "broadcast_efficiency": 50.0}, memory_bytes=4e9).broadcast_efficiency == 8.0
    older = {
        k: v for k, v in figures.items() if k not in ("reduce_efficiency", "broadcast_efficiency", "optimizer_tensor_s")
    }
    assert (
        device_spec(older, memory_bytes=4e9).reduce_efficiency,
        device_spec(older, memory_bytes=4e9).optimizer_tensor_s,
    ) == (None, None)


def test_the_slowest_rank_decides_each_figure():
    ranks = [
        {"matmul_flops": 80e9, "layer_overhead_s": 20e-6, "allreduce_seconds": [1e-4, 2e-3]},
        {"matmul_flops": 60e9, "layer_overhead_s": 30e-6, "allreduce_seconds": [2e-4, 1e-3]},
    ]
    assert combine(ranks) == {"matmul_flops": 60e9, "layer_overhead_s": 30e-6, "allreduce_seconds": [2e-4, 2e-3]}


# -- the CPU figures in the simulator -------------------------------------------------------------------


def _allreduce_detail(resources: ResourceSpec, graph: ModelGraph):
    context = compile_context(graph, resources)
    return simulate_batch(context, encode(context, [AllReduce(chunk_size=1).build(graph, resources)]), detail=True)


def test_ranks_that_cannot_overlap_pay_for_the_communication_hidden_behind_backward():
    graph = make_mlp_graph(batch_size=256, widths=(1024, 1024, 1024, 1024, 10))
    full, none, half = (_allreduce_detail(cpu_spec(comm_overlap=o), graph) for o in (1.0, 0.0, 0.5))
    busy = float(full.detail["allreduce_busy"][0])
    exposed = float(full.component("allreduce")[0])
    hidden = busy - exposed
    assert hidden > 0.2 * busy  # most of the per-layer all-reduces overlap backward when they can
    assert float(none.step_time[0]) == pytest.approx(float(full.step_time[0]) + hidden)
    assert float(half.step_time[0]) == pytest.approx(float(full.step_time[0]) + 0.5 * hidden)
    for result in (full, none, half):
        assert float(result.breakdown[0].sum()) == pytest.approx(float(result.step_time[0]))
    assert float(none.component("allreduce")[0]) == pytest.approx(exposed + hidden)


def test_each_collective_hidden_behind_backward_also_takes_its_latency_times_the_contention():
    graph = make_mlp_graph(batch_size=256, widths=(1024, 1024, 1024, 1024, 10))
    full = _allreduce_detail(cpu_spec(comm_overlap=1.0), graph)
    busy, latency = float(full.detail["allreduce_busy"][0]), float(full.detail["collective_latency"][0])
    hidden = busy - float(full.component("allreduce")[0])
    assert 0 < latency < busy and hidden > 0
    plain, contended = (
        _allreduce_detail(cpu_spec(comm_overlap=0.2, comm_latency_contention=c), graph) for c in (0.0, 1.5)
    )
    assert float(plain.step_time[0]) == pytest.approx(float(full.step_time[0]) + 0.8 * hidden)
    assert float(contended.step_time[0]) == pytest.approx(float(plain.step_time[0]) + 1.5 * hidden * latency / busy)
    assert float(contended.breakdown[0].sum()) == pytest.approx(float(contended.step_time[0]))


def test_latency_contention_leaves_a_bucket_launched_after_backward_alone():
    graph = make_mlp_graph(batch_size=256, widths=(1024, 1024, 1024, 1024, 10))
    fused = [AllReduce().build(graph, cpu_spec())]  # one group, ready when the last gradient is

    def step(**device: float) -> float:
        resources = cpu_spec(**device)
        return simulate(graph, resources, [s.replace(resources_id=resources.id) for s in fused])[0].step_time_s

    assert step(comm_overlap=0.2, comm_latency_contention=2.0) == pytest.approx(step(comm_overlap=0.2))


def test_full_overlap_is_the_default_and_changes_nothing():
    graph = make_mlp_graph(batch_size=256, widths=(1024, 1024, 1024, 10))
    default, explicit = _allreduce_detail(cpu_spec(), graph), _allreduce_detail(cpu_spec(comm_overlap=1.0), graph)
    assert float(default.step_time[0]) == float(explicit.step_time[0])


def _ps_on(graph: ModelGraph, resources: ResourceSpec, servers: dict[str, str]) -> Strategy:
    """The PS builder's strategy with some variables moved to another server (one runtime bucket per server)."""
    strategy = PS().build(graph, resources)
    variables = [c.model_dump() for c in strategy.variables]
    for config in variables:
        if config["var_name"] in servers:
            config["synchronizer"]["reduction_destination"] = servers[config["var_name"]]
    return strategy.replace(variables=variables)


def test_parameter_server_traffic_on_the_replicas_cores_is_charged_the_same_way():
    graph = make_mlp_graph(batch_size=256, widths=(1024, 1024, 1024, 1024, 10))
    early = {
        "fc4.weight": "127.0.0.1:CPU:1",
        "fc4.bias": "127.0.0.1:CPU:1",
        "fc3.weight": "127.0.0.1:CPU:1",
        "fc3.bias": "127.0.0.1:CPU:1",
    }
    overlapped, serial = (
        simulate(graph, spec, [_ps_on(graph, spec, early)])[0]
        for spec in (cpu_spec(comm_overlap=o) for o in (1.0, 0.0))
    )
    assert serial.step_time_s > overlapped.step_time_s
    assert serial.breakdown["ps"] > overlapped.breakdown["ps"] and serial.breakdown["allreduce"] == 0.0
    assert sum(serial.breakdown.values()) == pytest.approx(serial.step_time_s)


def test_a_fused_ps_bucket_pushes_when_its_last_gradient_is_ready():
    """The runtime launches a server's bucket from its last member's gradient hook, so one server's
    bucket of every variable leaves after backward: however little the cores overlap, nothing of it
    runs during compute (with a second server for the first gradients, some does: the test above)."""
    graph = make_mlp_graph(batch_size=256, widths=(1024, 1024, 1024, 1024, 10))
    overlapped, serial = (
        simulate(graph, spec, [PS().build(graph, spec)])[0] for spec in (cpu_spec(comm_overlap=o) for o in (1.0, 0.0))
    )
    assert serial.step_time_s == pytest.approx(overlapped.step_time_s)
    assert serial.breakdown["ps"] >= max(serial.ps_load.values())


def _conv_graph() -> ModelGraph:
    flops = 4e9
    conv = Layer(
        name="conv",
        type="Conv2d",
        kind="conv",
        fwd_flops=flops,
        bwd_flops=2 * flops,
        bytes_moved=1e6,
        output_bytes=1e6,
        variables=["conv.weight"],
    )
    fc = Layer(
        name="fc",
        type="Linear",
        kind="matmul",
        fwd_flops=flops,
        bwd_flops=2 * flops,
        bytes_moved=1e6,
        output_bytes=1e3,
        inputs=["conv"],
        variables=["fc.weight"],
    )
    variables = [Variable(name="conv.weight", shape=[64, 64, 3, 3]), Variable(name="fc.weight", shape=[10, 1000])]
    return ModelGraph(name="convnet", batch_size=8, layers=[conv, fc], variables=variables)


def test_convolutions_compute_at_their_own_efficiency_and_matmuls_do_not_change():
    graph = _conv_graph()
    same, slow = (
        simulate(graph, spec, [AllReduce().build(graph, spec)])[0]
        for spec in (cpu_spec(), cpu_spec(conv_efficiency=0.25))
    )
    conv_seconds = 3 * 4e9 / 50e9
    assert slow.breakdown["compute"] - same.breakdown["compute"] == pytest.approx(conv_seconds * (1 / 0.25 - 1))


def test_the_optimizer_update_streams_at_the_optimizer_efficiency():
    graph = _conv_graph()
    default, slow = (
        simulate(graph, spec, [AllReduce().build(graph, spec)])[0]
        for spec in (cpu_spec(), cpu_spec(optimizer_efficiency=0.125))
    )
    assert slow.breakdown["optimizer_update"] == pytest.approx(default.breakdown["optimizer_update"] * 0.5 / 0.125)


def test_a_server_on_a_replica_does_not_send_its_own_worker_gradients_over_the_link():
    """One host, two ranks, PS on rank 0's CPU: only rank 1's push and pull travel (as the runtime does
    it), the same bytes a two-rank all-reduce moves per rank; a separate server would receive both."""
    graph = make_mlp_graph(batch_size=8, widths=(1024, 1024, 1024, 10))
    on_replica = cpu_spec(comm_overlap=0.0)
    separate = on_replica.replace(
        nodes=[Node(address="127.0.0.1", chief=True, cpus=[0, 1, 2], device="CPU").model_dump()]
    )
    ps_here = PS().build(graph, on_replica)
    ps_apart = Strategy.parse(
        ps_here.model_dump(mode="json", exclude={"id", "resources_id"})
        | {
            "variables": [
                {"var_name": v.var_name, "synchronizer": {"kind": "ps", "reduction_destination": "127.0.0.1:CPU:2"}}
                for v in ps_here.variables
            ]
        }
    )
    here = simulate(graph, on_replica, [ps_here])[0].ps_load["127.0.0.1"]
    apart = simulate(graph, separate, [ps_apart])[0].ps_load["127.0.0.1"]
    link = on_replica.intra_node.bytes_per_s
    assert apart - here == pytest.approx(sum(v.nbytes for v in graph.trainable_variables) / link, rel=1e-6)


def test_dense_shards_on_one_server_pay_one_round_trip_and_sparse_shards_three_each():
    graph = make_mlp_graph(batch_size=8, widths=(64, 64, 64, 10))
    resources = cpu_spec(comm_overlap=0.0)
    alpha = resources.intra_node.latency_s
    whole, partitioned = (simulate(graph, resources, [b.build(graph, resources)])[0] for b in (PS(), PartitionedPS()))
    # the same bytes and updates, more shards: on one server they are one bucket either way
    assert partitioned.ps_load["127.0.0.1"] == pytest.approx(whole.ps_load["127.0.0.1"], rel=1e-9, abs=1e-12)

    sparse = make_embedding_graph(batch_size=64, rows=1000, dim=16)
    one, split = (simulate(sparse, resources, [b.build(sparse, resources)])[0] for b in (PS(), PartitionedPS()))
    table = next(v for v in sparse.trainable_variables if v.sparse)
    extra_shards = 2 - 1  # PartitionedPS splits the 1000-row table into its smallest divisor >= 2
    assert table.shape[0] % 2 == 0
    # a sparse exchange sends a row count, indices and values each way: three round trips of 2α
    assert split.ps_load["127.0.0.1"] - one.ps_load["127.0.0.1"] == pytest.approx(
        extra_shards * 3 * 2 * alpha, rel=1e-6
    )


def test_every_sparse_pull_is_exposed_as_the_runtime_exchanges_its_shards_one_after_another():
    """A sparse shard pushes, updates and pulls at the optimizer step before the next one starts, so its
    pull is never hidden behind another exchange: with one dense bucket besides, every pulled byte is on
    the step's critical path, at the pull's speed."""
    graph = make_embedding_graph(batch_size=64, rows=100_000, dim=16)
    slow, fast = (
        cpu_spec(comm_overlap=1.0, broadcast_efficiency=0.5),
        cpu_spec(comm_overlap=1.0, broadcast_efficiency=2.0),
    )
    table = next(v for v in graph.trainable_variables if v.sparse)
    pulled = sum(v.nbytes for v in graph.trainable_variables if not v.sparse) + table.lookups_per_step * table.row_bytes
    steps = [simulate(graph, spec, [PS().build(graph, spec)])[0].step_time_s for spec in (slow, fast)]
    assert steps[0] - steps[1] == pytest.approx(pulled / slow.intra_node.bytes_per_s * (1 / 0.5 - 1 / 2.0), rel=1e-6)


def test_sparse_tables_under_allreduce_all_gather_one_count_exchange_then_their_rows():
    graph = make_embedding_graph(batch_size=64, rows=100_000, dim=16)
    resources = cpu_spec(comm_overlap=1.0)
    table = next(v for v in graph.trainable_variables if v.sparse)
    context = compile_context(graph, resources)
    fused, unfused = (encode(context, [b.build(graph, resources)]) for b in (AllReduce(), AllReduce(chunk_size=1)))
    fused_result, unfused_result = (
        simulate_batch(context, fused, detail=True),
        simulate_batch(context, unfused, detail=True),
    )
    rows = table.lookups_per_step
    wire = rows * (table.row_bytes + 8)  # values and int64 indices, from the one peer of two ranks
    dense = sum(v.nbytes for v in graph.trainable_variables if not v.sparse)
    assert fused_result.detail["allreduce_bytes"][0] == pytest.approx(dense + wire)
    assert wire < table.nbytes / 10  # the rows looked up, not the table
    # the table is its own exchange either way: unfusing adds one all-reduce latency per extra dense group only
    dense_groups = len([v for v in graph.trainable_variables if not v.sparse])
    alpha = resources.intra_node.latency_s
    extra = unfused_result.detail["allreduce_busy"][0] - fused_result.detail["allreduce_busy"][0]
    assert extra == pytest.approx((dense_groups - 1) * 2 * alpha, rel=1e-6)


def test_normalizations_stream_at_their_own_efficiency_and_activations_do_not_change():
    nbytes = 64e6
    norm = Layer(
        name="norm",
        type="LayerNorm",
        kind="norm",
        bytes_moved=nbytes,
        output_bytes=nbytes / 2,
        variables=["norm.weight"],
    )
    act = Layer(
        name="act", type="GELU", kind="elementwise", bytes_moved=nbytes, output_bytes=nbytes / 2, inputs=["norm"]
    )
    graph = ModelGraph(
        name="norms", batch_size=8, layers=[norm, act], variables=[Variable(name="norm.weight", shape=[1024])]
    )
    same, slow = (
        simulate(graph, spec, [AllReduce().build(graph, spec)])[0]
        for spec in (cpu_spec(), cpu_spec(norm_efficiency=0.125))
    )
    norm_seconds = 3 * nbytes / (8e9 * 0.5)  # forward once, backward twice, at the elementwise rate
    assert slow.breakdown["compute"] - same.breakdown["compute"] == pytest.approx(norm_seconds * (0.5 / 0.125 - 1))


def two_tensor_graph() -> ModelGraph:
    """A 256 KB and a 16 MB weight, each behind a cheap Linear: tensor size is all that differs."""
    small = Variable(name="small.weight", shape=[256, 256])
    large = Variable(name="large.weight", shape=[2048, 2048])
    layers = [
        Layer(
            name=v.name.split(".")[0],
            type="Linear",
            kind="matmul",
            fwd_flops=1e6,
            bwd_flops=2e6,
            bytes_moved=1e3,
            output_bytes=1e3,
            variables=[v.name],
        )
        for v in (small, large)
    ]
    return ModelGraph(name="two-tensors", batch_size=8, layers=layers, variables=[small, large])


def test_large_tensors_update_slower_per_byte_past_the_knee():
    graph = two_tensor_graph()
    small, large = graph.variables
    knee = 4e6
    flat, sized = (
        simulate(graph, spec, [AllReduce().build(graph, spec)])[0]
        for spec in (cpu_spec(), cpu_spec(optimizer_knee_bytes=knee))
    )
    rate = 8e9 * 0.5  # the optimizer streams at the elementwise efficiency here
    per_param = 3 * 4 + 2 * 8
    expected = sum(v.numel * per_param / rate * v.nbytes / knee for v in (small, large))
    assert sized.breakdown["optimizer_update"] - flat.breakdown["optimizer_update"] == pytest.approx(expected, rel=1e-9)
    assert large.nbytes / knee > 4 * small.nbytes / knee  # the large tensor carries nearly all of it


def test_a_sparse_table_updates_only_its_touched_rows_under_all_reduce_as_on_its_server():
    graph, spec = make_embedding_graph(rows=100_000, dim=64), cpu_spec()
    table = next(v for v in graph.variables if v.sparse)
    dense = [v for v in graph.trainable_variables if not v.sparse]
    per_param = 3 * 4 + 2 * graph.optimizer.state_bytes_per_param
    rate = 8e9 * 0.5  # the optimizer streams at the elementwise efficiency here
    touched = table.lookups_per_step * table.numel / table.shape[0]
    # Adagrad's rows sorted first, then gathered and scattered: two coalesces in all
    coalesced = ADAPTIVE_SPARSE_STEP_COALESCES * table.lookups_per_step * (table.row_bytes + 8) / rate
    expected = (touched + sum(v.numel for v in dense)) * per_param / rate + coalesced
    prediction = simulate(graph, spec, [AllReduce().build(graph, spec)])[0]
    assert prediction.breakdown["optimizer_update"] == pytest.approx(expected, rel=1e-9)
    assert expected < 0.1 * table.numel * per_param / rate  # far below a dense update of the table


def test_compression_passes_over_large_tensors_follow_the_same_size_law():
    graph = two_tensor_graph()
    small, large = graph.variables
    knee = 4e6
    flat, sized = (
        compile_context(graph, spec).compression for spec in (cpu_spec(), cpu_spec(optimizer_knee_bytes=knee))
    )
    scale = 1 + np.array([small.nbytes, large.nbytes]) / knee
    np.testing.assert_allclose(sized.byte_passes, flat.byte_passes * scale)
    np.testing.assert_allclose(sized.cast_bytes, flat.cast_bytes * scale)
    np.testing.assert_array_equal(sized.select_bytes, flat.select_bytes)  # its probe already runs beyond the caches
    np.testing.assert_array_equal(sized.unit, flat.unit)  # the wire does not change
    np.testing.assert_array_equal(sized.lowrank_bytes, flat.lowrank_bytes)  # PowerSGD has a law of its own
    strided = compile_context(graph, cpu_spec(lowrank_knee_bytes=knee)).compression
    np.testing.assert_allclose(strided.lowrank_bytes, flat.lowrank_bytes * scale)
    np.testing.assert_array_equal(strided.byte_passes, flat.byte_passes)


def test_the_lowrank_probes_give_powersgd_its_own_size_law():
    small, large = LOWRANK_MATRIX_BYTES
    knee, base = 8e6, 10e9
    figures = calibrated(
        copy_bandwidth=20e9,
        optimizer_rate=5e9,
        lowrank_rate=base / (1 + small / knee),
        lowrank_large_rate=base / (1 + large / knee),
    )
    device = device_spec(figures, memory_bytes=4e9)
    assert device.lowrank_knee_bytes == pytest.approx(knee) and device.lowrank_efficiency == pytest.approx(base / 20e9)
    assert size_law(5e9, 5e9, LOWRANK_MATRIX_BYTES) == (5e9, None)


def test_optimizer_size_law_recovers_the_knee_from_the_two_probes():
    small, large = OPTIMIZER_TENSOR_BYTES
    knee, base = 8e6, 10e9
    rate_small, rate_large = base / (1 + small / knee), base / (1 + large / knee)
    rate, fitted = optimizer_size_law(rate_small, rate_large)
    assert fitted == pytest.approx(knee) and rate == pytest.approx(base)
    assert optimizer_size_law(10e9, 9.9e9) == (10e9, None)  # no slower per byte: no knee
    figures = calibrated(copy_bandwidth=20e9, optimizer_rate=rate_small, optimizer_large_rate=rate_large)
    device = device_spec(figures, memory_bytes=4e9)
    assert device.optimizer_knee_bytes == pytest.approx(knee) and device.optimizer_efficiency == pytest.approx(
        base / 20e9
    )


def test_topk_and_fp16_pay_selection_and_casts_at_their_own_rates():
    graph = make_mlp_graph(batch_size=8, widths=(1024, 1024, 10))
    nbytes = sum(v.nbytes for v in graph.trainable_variables)

    def allreduce_busy(compressor: str, **device: float) -> float:
        spec = cpu_spec(**device)
        context = compile_context(graph, spec)
        batch = encode(context, [AllReduce(compressor=compressor).build(graph, spec)])
        return float(simulate_batch(context, batch, detail=True).detail["allreduce_busy"][0])

    # top-k at 1% (AutoDist has no top-k compressor: set it on the batch) -- selection is one pass at select rate
    spec = cpu_spec(select_efficiency=0.01)
    context = compile_context(graph, spec)
    batch = encode(context, [AllReduce().build(graph, spec)])
    batch.compressor[:], batch.compressor_param[:] = 4, 0.01
    fast = compile_context(graph, cpu_spec())
    fast_batch = encode(fast, [AllReduce().build(graph, cpu_spec())])
    fast_batch.compressor[:], fast_batch.compressor_param[:] = 4, 0.01
    slow_busy = simulate_batch(context, batch, detail=True).detail["allreduce_busy"][0]
    fast_busy = simulate_batch(fast, fast_batch, detail=True).detail["allreduce_busy"][0]
    assert slow_busy - fast_busy == pytest.approx(nbytes / (8e9 * 0.01) - nbytes / (8e9 * 0.5), rel=1e-6)
    # fp16: 4.5 b of casts at the cast rate
    assert allreduce_busy("HorovodCompressor", cast_efficiency=0.05) - allreduce_busy(
        "HorovodCompressor"
    ) == pytest.approx(4.5 * nbytes / (8e9 * 0.05) - 4.5 * nbytes / (8e9 * 0.5), rel=1e-6)


def test_reduce_scatter_and_all_gather_run_at_the_scatter_efficiency():
    graph = make_mlp_graph(batch_size=8, widths=(1024, 1024, 10))
    nbytes = sum(v.nbytes for v in graph.trainable_variables)

    def sharded_seconds(**device: float) -> float:
        spec = cpu_spec(comm_overlap=1.0, **device)
        strategy = AllReduce().build(graph, spec)
        sharded = strategy.replace(
            variables=[{"var_name": v.name, "synchronizer": {"kind": "sharded"}} for v in graph.trainable_variables]
        )
        return simulate(graph, spec, [sharded])[0].breakdown["sharded"]

    bandwidth = 4.0e9 / 8  # the loopback link: 4 Gbit/s
    # reduce-scatter and all-gather each move (p-1)/p = 1/2 of the bytes; at a quarter of the bandwidth, 4x as long
    extra = sharded_seconds(scatter_efficiency=0.25) - sharded_seconds()
    assert extra == pytest.approx(2 * 0.5 * nbytes / bandwidth * (4 - 1), rel=1e-6)


# -- collectives as gloo runs them: half-precision sums, per-rank gathers, fused PS pulls ---------------


def _allreduce_busy(
    graph: ModelGraph, compressor: int, param: float, *, latency_us: float = 100.0, **device: float
) -> float:
    """The collective stream's busy seconds with every dense variable under one compressor kind."""
    spec = cpu_spec(**device)
    link = Link(kind="loopback", bandwidth_gbps=4.0, latency_us=latency_us, efficiency=1.0).model_dump(mode="json")
    spec = spec.replace(network=link, intra_node=link)
    context = compile_context(graph, spec)
    batch = encode(context, [AllReduce().build(graph, spec)])
    batch.compressor[:], batch.compressor_param[:] = compressor, param
    return float(simulate_batch(context, batch, detail=True).detail["allreduce_busy"][0])


def test_a_half_precision_payload_moves_at_the_half_reduce_efficiency():
    graph = make_mlp_graph(batch_size=8, widths=(1024, 1024, 10))
    nbytes = sum(v.nbytes for v in graph.trainable_variables)
    bandwidth = 4.0e9 / 8
    # two ranks: a ring all-reduce of n bytes costs n / B; the fp16 payload is n / 2, paced at half speed per byte
    extra = _allreduce_busy(graph, 1, 1.0, half_reduce_efficiency=0.5) - _allreduce_busy(graph, 1, 1.0)
    assert extra == pytest.approx(nbytes / 2 / bandwidth, rel=1e-6)


def test_compression_streams_its_plain_passes_at_the_stream_efficiency():
    graph = make_mlp_graph(batch_size=8, widths=(1024, 1024, 10))
    nbytes = sum(v.nbytes for v in graph.trainable_variables)
    # fp16: adding, scaling and subtracting the error (8 passes) and the copy back (2)
    extra = _allreduce_busy(graph, 1, 1.0, stream_efficiency=0.05) - _allreduce_busy(graph, 1, 1.0)
    assert extra == pytest.approx(10 * nbytes / (8e9 * 0.05) - 10 * nbytes / (8e9 * 0.5), rel=1e-6)
    unset = _allreduce_busy(graph, 1, 1.0, stream_efficiency=None) - _allreduce_busy(
        graph, 1, 1.0, stream_efficiency=0.5
    )
    assert unset == pytest.approx(0.0, abs=1e-12)


def test_powersgd_streams_its_passes_at_the_lowrank_efficiency():
    graph = make_mlp_graph(batch_size=8, widths=(1024, 1024, 10))
    matrices = sum(v.nbytes for v in graph.trainable_variables if len(v.shape) == 2)
    extra = _allreduce_busy(graph, 3, 4.0, lowrank_efficiency=0.05) - _allreduce_busy(graph, 3, 4.0)
    assert extra == pytest.approx(9 * matrices / (8e9 * 0.05) - 9 * matrices / (8e9 * 0.5), rel=1e-6)


def test_powersgd_pays_a_second_latency_for_q_which_waits_for_the_sum_of_p():
    graph = make_mlp_graph(batch_size=8, widths=(1024, 1024, 10))
    ring_latency = 2 * 100e-6  # two ranks: 2(p - 1)·α
    plain = _allreduce_busy(graph, 0, 1.0) - _allreduce_busy(graph, 0, 1.0, latency_us=0.0)
    powersgd = _allreduce_busy(graph, 3, 4.0) - _allreduce_busy(graph, 3, 4.0, latency_us=0.0)
    assert plain == pytest.approx(ring_latency, rel=1e-6)
    assert powersgd == pytest.approx(2 * ring_latency, rel=1e-6)
    vectors = make_mlp_graph(batch_size=8, widths=(1024, 1024, 10))
    frozen_matrices = [v.model_copy(update={"trainable": len(v.shape) == 1}) for v in vectors.variables]
    vectors = vectors.model_copy(update={"variables": frozen_matrices})
    only_vectors = _allreduce_busy(vectors, 3, 4.0) - _allreduce_busy(vectors, 3, 4.0, latency_us=0.0)
    assert only_vectors == pytest.approx(ring_latency, rel=1e-6)


def test_topk_entries_and_sparse_rows_are_all_gathered_at_the_gather_efficiency():
    graph = make_mlp_graph(batch_size=8, widths=(1024, 1024, 10))
    bandwidth = 4.0e9 / 8
    wire = sum(min(0.01 * (v.nbytes / 4) * (4 + 4), v.nbytes) for v in graph.trainable_variables)
    # each of two ranks receives its peer's values and int32 indices: wire / B, four times as long at 0.25
    extra = _allreduce_busy(graph, 4, 0.01, gather_efficiency=0.25) - _allreduce_busy(graph, 4, 0.01)
    assert extra == pytest.approx(3 * wire / bandwidth, rel=1e-6)

    sparse = make_embedding_graph(batch_size=64, rows=100_000, dim=16)
    table = next(v for v in sparse.trainable_variables if v.sparse)
    rows = table.lookups_per_step * (table.row_bytes + 8)
    slow, fast = (_allreduce_busy(sparse, 0, 1.0, gather_efficiency=g) for g in (0.25, None))
    assert slow - fast == pytest.approx(3 * rows / bandwidth, rel=1e-6)


def test_a_fused_ps_bucket_pulls_only_after_its_push_and_update():
    # a wide layer behind almost no compute: the push cannot hide, and the one bucket's pull waits for it
    graph = make_mlp_graph(batch_size=1, widths=(2048, 2048, 10))
    nbytes = sum(v.nbytes for v in graph.trainable_variables)
    data = cpu_spec(comm_overlap=1.0).model_dump(mode="json", exclude={"id"})
    slow_link, fast_link = (
        ResourceSpec.parse({**data, "intra_node": {**data["intra_node"], "bandwidth_gbps": gbps}})
        for gbps in (4.0, 8.0)
    )
    slow, fast = (simulate(graph, spec, [PS().build(graph, spec)])[0].step_time_s for spec in (slow_link, fast_link))
    # the worker that is not the server pushes nbytes and pulls them back, one after the other
    assert slow - fast == pytest.approx(2 * (nbytes / 0.5e9 - nbytes / 1.0e9), rel=0.02)


def test_a_ps_push_runs_at_the_reduce_efficiency_and_its_pull_at_the_broadcast_efficiency():
    graph = make_mlp_graph(batch_size=1, widths=(2048, 2048, 10))
    nbytes = sum(v.nbytes for v in graph.trainable_variables)
    bandwidth = 0.5e9  # the loopback link: 4 Gbit/s

    def step(**device: float) -> float:
        spec = cpu_spec(comm_overlap=1.0, **device)
        return simulate(graph, spec, [PS().build(graph, spec)])[0].step_time_s

    base = step()
    # one bucket: rank 1 pushes nbytes to the server on rank 0, which sends them back after its update
    assert step(reduce_efficiency=0.5) - base == pytest.approx(nbytes / bandwidth, rel=0.02)
    assert base - step(broadcast_efficiency=2.0) == pytest.approx(0.5 * nbytes / bandwidth, rel=0.02)


def test_every_tensor_the_optimizer_steps_costs_the_optimizer_tensor_seconds():
    graph = make_mlp_graph(batch_size=8, widths=(256, 256, 256, 256, 10))
    count = len(graph.trainable_variables)
    overhead = 1e-3

    def update(builder: str, **device: float) -> float:
        spec = cpu_spec(comm_overlap=1.0, **device)
        strategy = AllReduce().build(graph, spec)
        if builder == "sharded":
            strategy = strategy.replace(
                variables=[{"var_name": v.name, "synchronizer": {"kind": "sharded"}} for v in graph.trainable_variables]
            )
        prediction = simulate(graph, spec, [strategy if builder != "ps" else PS().build(graph, spec)])[0]
        return prediction.breakdown["optimizer_update"] + prediction.breakdown["ps"]

    # all-reduce: every variable is its own tensor on every rank; sharded: one flat shard
    assert update("allreduce", optimizer_tensor_s=overhead) - update("allreduce") == pytest.approx(count * overhead)
    assert update("sharded", optimizer_tensor_s=overhead) - update("sharded") == pytest.approx(overhead)
    # PS: the server steps each variable it holds, before the pull can leave
    assert update("ps", optimizer_tensor_s=overhead) - update("ps") == pytest.approx(count * overhead, rel=0.02)


def test_a_compute_bound_step_names_what_compute_does_not_hide():
    graph = make_mlp_graph(batch_size=256, widths=(1024, 1024, 1024, 1024, 10))
    serial, overlapped = (
        simulate(graph, cpu_spec(comm_overlap=o), [PS().build(graph, cpu_spec(comm_overlap=o))])[0] for o in (0.0, 1.0)
    )
    assert (
        serial.bottleneck.startswith("compute-bound")
        and "next comes the parameter-server exchange" in serial.bottleneck
    )
    assert serial.breakdown["ps"] > 0.05 * serial.step_time_s
    assert "next comes the parameter-server exchange" in overlapped.bottleneck  # 29% of the step even when it overlaps
    large = make_mlp_graph(batch_size=4096, widths=(1024, 1024, 1024, 1024, 10))
    hidden = simulate(large, cpu_spec(comm_overlap=1.0), [AllReduce().build(large, cpu_spec(comm_overlap=1.0))])[0]
    assert max(v for k, v in hidden.breakdown.items() if k != "compute") < 0.05 * hidden.step_time_s
    assert hidden.bottleneck.startswith("compute-bound") and hidden.bottleneck.endswith(
        "communication is hidden behind it"
    )


def test_sparse_gradients_are_coalesced_at_the_coalesce_efficiency():
    graph = make_embedding_graph(batch_size=64, rows=100_000, dim=16)
    table = next(v for v in graph.trainable_variables if v.sparse)
    sparse_step = SPARSE_STEP_COALESCES.get(graph.optimizer.kind, ADAPTIVE_SPARSE_STEP_COALESCES)
    own = table.lookups_per_step * (table.row_bytes + 8)
    # the probe's rate holds for its own rows; the 0.1 of a byte that is a copy is paid per byte of these
    work = table.lookups_per_step * (0.9 * COALESCE_PROBE_ROW_BYTES + 0.1 * (table.row_bytes + 8))
    slow, fast = cpu_spec(coalesce_efficiency=0.05), cpu_spec()
    extra_per_pass = work / (8e9 * 0.05) - own / (8e9 * 0.5)
    # under all-reduce: each rank coalesces its rows, then the two ranks' rows into one sum
    busy = [_allreduce_busy(graph, 0, 1.0, coalesce_efficiency=c) for c in (0.05, None)]
    assert busy[0] - busy[1] == pytest.approx(3 * extra_per_pass, rel=1e-6)
    # and Adagrad's sparse step costs two coalesces of the rows it is handed
    update = [
        simulate(graph, spec, [AllReduce().build(graph, spec)])[0].breakdown["optimizer_update"]
        for spec in (slow, fast)
    ]
    assert update[0] - update[1] == pytest.approx(sparse_step * extra_per_pass, rel=1e-6)
    # a server coalesces its rows where they are pushed, both pushes, steps them and finds the rows that changed
    ps = [simulate(graph, spec, [PS().build(graph, spec)])[0].breakdown["ps"] for spec in (slow, fast)]
    passes = 1 + 2 + SPARSE_CHANGED_ROWS_COALESCES + sparse_step
    assert ps[0] - ps[1] == pytest.approx(passes * extra_per_pass, rel=1e-6)
    # SGD adds the sorted rows into the parameter: one coalesce, not Adagrad's two
    sgd = graph.replace(optimizer={"kind": "sgd", "state_bytes_per_param": 0.0})
    update = [
        simulate(sgd, spec, [AllReduce().build(sgd, spec)])[0].breakdown["optimizer_update"] for spec in (slow, fast)
    ]
    assert update[0] - update[1] == pytest.approx(extra_per_pass, rel=1e-6)
