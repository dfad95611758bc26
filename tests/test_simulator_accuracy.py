"""Simulator accuracy on CPU ranks: the scoring and record machinery of `benchmarks/simulator_accuracy.py`
(on synthetic records, no timing), how calibrated figures become a device kind, and the CPU figures'
effect on predictions (convolution and optimizer efficiency, compute/communication overlap)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
from conftest import make_mlp_graph

from simulator import compile_context, encode, simulate, simulate_batch
from stratagem.builders import PS, AllReduce
from stratagem.calibrate import DEVICE_KIND, combine, device_spec
from stratagem.ir import DeviceSpec, Layer, Link, ModelGraph, Node, ResourceSpec, Variable

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "simulator_accuracy.py"


@pytest.fixture(scope="module")
def accuracy():
    spec = importlib.util.spec_from_file_location("simulator_accuracy", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules["simulator_accuracy"] = module
    spec.loader.exec_module(module)
    return module


def cpu_spec(**device: float | None) -> ResourceSpec:
    """Two CPU ranks on loopback, with a device kind whose figures the test sets."""
    figures = {"peak_flops": {"float32": 50e9}, "memory_bytes": 8e9, "memory_bandwidth": 8e9, "matmul_efficiency": 1.0,
               "elementwise_efficiency": 0.5, "launch_overhead_s": 20e-6, "is_gpu": False, **device}
    link = Link(kind="loopback", bandwidth_gbps=4.0, latency_us=100.0, efficiency=1.0)
    return ResourceSpec(name="cpu-test", nodes=[Node(address="127.0.0.1", chief=True, cpus=[0, 1], device="CPU")],
                        network=link, intra_node=link, devices={"CPU": DeviceSpec(name="CPU", **figures)})


# -- metrics and records --------------------------------------------------------------------------------


def test_mape_and_kendall_tau_match_hand_computed_values(accuracy):
    assert accuracy.mape([1.0, 2.0], [1.1, 1.8]) == pytest.approx(0.1)
    assert accuracy.kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert accuracy.kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # one swapped pair of six: (5 - 1) / 6
    assert accuracy.kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    # tau-b with a tie in the second ranking: 2 concordant, 0 discordant, 1 tie -> 2 / sqrt(3 * 2)
    assert accuracy.kendall_tau([1, 2, 3], [1, 2, 2]) == pytest.approx(2 / math.sqrt(6))
    assert math.isnan(accuracy.kendall_tau([1, 2, 3], [5, 5, 5]))


def test_records_round_trip_into_pairs_with_rounds_and_failures(accuracy, tmp_path):
    graph, resources = make_mlp_graph(), cpu_spec()
    strategies = [AllReduce().build(graph, resources), PS().build(graph, resources)]
    lines = []
    for round_medians in ((0.10, 0.30), (0.12, 0.34), (0.11, None)):
        for strategy, median in zip(strategies, round_medians, strict=True):
            result = {"outcome": "ok", "median_s": median} if median else {"outcome": "hang", "median_s": None}
            lines.append(accuracy.record_line(graph, resources, strategy, result))
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(lines) + "\n")
    first = json.loads(lines[0])
    assert set(first) == {"graph", "resources", "strategy", "result"}
    assert ResourceSpec.parse(first["resources"]).id == resources.id

    pairs = {p.name: p for p in accuracy.read_records(path)}
    assert set(pairs) == {"AllReduce", "PS"}
    assert pairs["AllReduce"].medians == [0.10, 0.12, 0.11] and pairs["AllReduce"].measured == pytest.approx(0.11)
    assert pairs["PS"].medians == [0.30, 0.34] and pairs["PS"].failures == ["hang"]
    assert pairs["PS"].spread == pytest.approx(0.04 / 0.32)

    accuracy.predict(list(pairs.values()))
    expected = simulate(graph, resources, strategies)
    assert pairs["AllReduce"].predicted == pytest.approx(expected[0].step_time_s)
    report = accuracy.accuracy_report(list(pairs.values()))
    assert report["overall"]["n"] == 2 and report["models"]["mlp"]["n"] == 2
    errors = [abs(p.predicted - p.measured) / p.measured for p in pairs.values()]
    assert report["overall"]["mape"] == pytest.approx(sum(errors) / 2, abs=1e-4)


def test_report_scores_ranking_within_each_model_and_pooled(accuracy):
    graph = make_mlp_graph()

    def pair(model: str, measured: float, predicted: float):
        p = accuracy.Measured(model, f"{model}-{measured}", graph, cpu_spec(), None, medians=[measured, measured])
        p.predicted = predicted
        return p

    # model a: ranked right, 10% off; model b: ranked backwards, exact on average
    pairs = [pair("a", 1.0, 1.1), pair("a", 2.0, 2.2), pair("a", 3.0, 3.3), pair("b", 10.0, 12.0), pair("b", 12.0, 10.0)]
    report = accuracy.accuracy_report(pairs)
    assert report["models"]["a"] == {"n": 3, "mape": pytest.approx(0.1), "kendall_tau": pytest.approx(1.0)}
    assert report["models"]["b"]["kendall_tau"] == pytest.approx(-1.0)
    assert report["overall"]["kendall_tau_within"] == pytest.approx(0.0)
    assert report["overall"]["kendall_tau"] > 0.5  # pooled: the models' scales dominate
    assert report["overall"]["meets_targets"] is False
    assert accuracy.noise_report(pairs)["median_round_spread"] == 0.0


# -- calibration figures ----------------------------------------------------------------------------------


def test_calibrated_figures_become_efficiencies_of_the_measured_rates():
    figures = {"matmul_flops": 80e9, "bf16_flops": 300e9, "conv_flops": 40e9, "copy_bandwidth": 8e9,
               "elementwise_rate": 2e9, "optimizer_rate": 12e9, "layer_overhead_s": 30e-6, "overlap": -0.05}
    device = device_spec(figures, memory_bytes=4e9)
    assert device.name == DEVICE_KIND and not device.is_gpu
    assert device.flops_for("float32") == 80e9 and device.matmul_efficiency == 1.0
    assert device.conv_efficiency == pytest.approx(0.5)
    assert device.elementwise_efficiency == pytest.approx(0.25)
    assert device.optimizer_efficiency == 1.0  # faster than a copy is priced as a copy
    assert device.comm_overlap == 0.0  # a slightly negative measured share means none
    assert device.launch_overhead_s == pytest.approx(30e-6)


def test_the_slowest_rank_decides_each_figure():
    ranks = [{"matmul_flops": 80e9, "layer_overhead_s": 20e-6, "allreduce_seconds": [1e-4, 2e-3]},
             {"matmul_flops": 60e9, "layer_overhead_s": 30e-6, "allreduce_seconds": [2e-4, 1e-3]}]
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


def test_full_overlap_is_the_default_and_changes_nothing():
    graph = make_mlp_graph(batch_size=256, widths=(1024, 1024, 1024, 10))
    default, explicit = _allreduce_detail(cpu_spec(), graph), _allreduce_detail(cpu_spec(comm_overlap=1.0), graph)
    assert float(default.step_time[0]) == float(explicit.step_time[0])


def test_parameter_server_traffic_on_the_replicas_cores_is_charged_the_same_way():
    graph = make_mlp_graph(batch_size=256, widths=(1024, 1024, 1024, 1024, 10))
    overlapped, serial = (simulate(graph, cpu_spec(comm_overlap=o), [PS().build(graph, cpu_spec(comm_overlap=o))])[0] for o in (1.0, 0.0))
    assert serial.step_time_s > overlapped.step_time_s
    assert serial.breakdown["ps"] > overlapped.breakdown["ps"] and serial.breakdown["allreduce"] == 0.0
    assert sum(serial.breakdown.values()) == pytest.approx(serial.step_time_s)


def _conv_graph() -> ModelGraph:
    flops = 4e9
    conv = Layer(name="conv", type="Conv2d", kind="conv", fwd_flops=flops, bwd_flops=2 * flops, bytes_moved=1e6,
                 output_bytes=1e6, variables=["conv.weight"])
    fc = Layer(name="fc", type="Linear", kind="matmul", fwd_flops=flops, bwd_flops=2 * flops, bytes_moved=1e6,
               output_bytes=1e3, inputs=["conv"], variables=["fc.weight"])
    variables = [Variable(name="conv.weight", shape=[64, 64, 3, 3]), Variable(name="fc.weight", shape=[10, 1000])]
    return ModelGraph(name="convnet", batch_size=8, layers=[conv, fc], variables=variables)


def test_convolutions_compute_at_their_own_efficiency_and_matmuls_do_not_change():
    graph = _conv_graph()
    same, slow = (simulate(graph, spec, [AllReduce().build(graph, spec)])[0] for spec in (cpu_spec(), cpu_spec(conv_efficiency=0.25)))
    conv_seconds = 3 * 4e9 / 50e9
    assert slow.breakdown["compute"] - same.breakdown["compute"] == pytest.approx(conv_seconds * (1 / 0.25 - 1))


def test_the_optimizer_update_streams_at_the_optimizer_efficiency():
    graph = _conv_graph()
    default, slow = (simulate(graph, spec, [AllReduce().build(graph, spec)])[0] for spec in (cpu_spec(), cpu_spec(optimizer_efficiency=0.125)))
    assert slow.breakdown["optimizer_update"] == pytest.approx(default.breakdown["optimizer_update"] * 0.5 / 0.125)
