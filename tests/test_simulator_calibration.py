"""Calibration: the alpha-beta fit, and a real measurement of this machine through the CLI."""

from __future__ import annotations

import math

import pytest
from runtime_helpers import run_ranks

from simulator import simulate
from stratagem.calibrate.figures import DEVICE_KIND, fit_ring
from stratagem.cli import main
from stratagem.errors import InvalidResourceSpecError
from stratagem.ir import AllReduceSynchronizer, Layer, ModelGraph, ResourceSpec, Strategy, Variable, VariableConfig


def test_ring_fit_recovers_latency_and_bandwidth():
    alpha, bandwidth, ranks = 30e-6, 2e9, 4
    sizes = [4, 4096, 1 << 18, 1 << 21, 1 << 23]
    seconds = [2 * (ranks - 1) * alpha + 2 * (ranks - 1) / ranks * n / bandwidth for n in sizes]
    fitted_alpha, fitted_bandwidth = fit_ring(sizes, seconds, ranks)
    assert fitted_alpha == pytest.approx(alpha, rel=1e-6)
    assert fitted_bandwidth == pytest.approx(bandwidth, rel=1e-6)


def test_a_latency_floor_at_small_sizes_does_not_tilt_the_bandwidth():
    """On loopback a tiny all-reduce waits for the peer's wake-up (about a millisecond), so the small
    buffers sit on a flat floor above the line; the large buckets alone decide the bandwidth."""
    alpha, bandwidth, ranks, wake_up = 30e-6, 2e9, 2, 1e-3
    sizes = [4, 4096, 1 << 18, 1 << 21, 1 << 23, 1 << 25]
    line = [2 * (ranks - 1) * alpha + 2 * (ranks - 1) / ranks * n / bandwidth for n in sizes]
    seconds = [max(t, wake_up) for t in line]
    fitted_alpha, fitted_bandwidth = fit_ring(sizes, seconds, ranks)
    assert fitted_bandwidth == pytest.approx(bandwidth, rel=1e-6)
    assert fitted_alpha == pytest.approx(wake_up / 2, rel=0.01)


def test_a_sweep_of_one_size_is_refused_by_name():
    with pytest.raises(InvalidResourceSpecError, match="allreduce_bytes"):
        fit_ring([1 << 20, 1 << 20], [1e-3, 1.1e-3], 2)
    with pytest.raises(InvalidResourceSpecError, match="allreduce_bytes"):
        fit_ring([4, 1 << 20], [1e-3], 2)


def test_reread_rebuilds_a_calibrated_spec_from_its_figures_and_leaves_others_alone(t4_2x4: ResourceSpec):
    from stratagem.calibrate import reread, spec_from_figures

    figures = {
        "ranks": 2,
        "threads": 1,
        "allreduce_bytes": [4, 4096, 1 << 18, 1 << 21, 1 << 23],
        "allreduce_seconds": [1e-3, 1e-3, 1.2e-3, 3e-3, 1.2e-2],
        "spare_cores": 0,
        "matmul_flops": 5e10,
        "bf16_flops": 1e10,
        "conv_flops": 3e10,
        "copy_bandwidth": 1e10,
        "elementwise_rate": 5e9,
        "norm_rate": 3e9,
        "layer_overhead_s": 1e-5,
        "optimizer_rate": 3e9,
        "overlap": 0.0,
    }
    spec = spec_from_figures(figures, address="10.0.0.7")
    stale = spec.replace(network={**spec.network.model_dump(mode="json"), "bandwidth_gbps": 1.0})
    assert reread(stale) == spec
    assert reread(stale).nodes[0].address == "10.0.0.7"
    assert reread(t4_2x4) is t4_2x4


def test_the_evictor_streams_the_last_level_cache_within_bounds(tmp_path):
    from stratagem.calibrate.timing import EVICT_MAX_BYTES, EVICT_MIN_BYTES, eviction_bytes, last_level_cache_bytes

    for index, size in enumerate(("48K", "2048K", "491520K")):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    assert last_level_cache_bytes(tmp_path) == 491520 << 10
    assert last_level_cache_bytes(tmp_path / "missing") is None
    assert eviction_bytes(491520 << 10) == 491520 << 10
    assert eviction_bytes(None) == EVICT_MIN_BYTES
    assert eviction_bytes(4 << 30) == EVICT_MAX_BYTES


def test_the_stepper_evicts_before_every_timed_run_and_does_not_time_it():
    import time

    from stratagem.calibrate.timing import Stepper

    events: list[str] = []

    def evict() -> None:
        events.append("evict")
        time.sleep(0.02)

    def run() -> None:
        events.append("run")
        time.sleep(0.002)

    stepper = Stepper(evict=evict)
    seconds = stepper.median(run, budget_s=0.0, least=4)
    assert events == ["run"] + ["evict", "run"] * 4
    assert 0.0015 < seconds < 0.015


def test_calibration_needs_two_ranks():
    from stratagem.calibrate import calibrate

    with pytest.raises(InvalidResourceSpecError, match="ranks"):
        calibrate(ranks=1)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_calibrate_cli_writes_a_spec_the_simulator_can_use(tmp_path):
    path = tmp_path / "spec.json"
    assert main(["calibrate", "--ranks", "2", "-o", str(path)]) == 0
    spec = ResourceSpec.load(path)
    device = spec.devices[DEVICE_KIND]
    figures = [
        device.peak_flops["float32"],
        device.memory_bandwidth,
        device.launch_overhead_s,
        spec.intra_node.bandwidth_gbps,
        spec.intra_node.latency_us,
    ]
    assert all(math.isfinite(x) and x > 0 for x in figures), figures
    assert 0 < device.reduce_efficiency <= 8 and 0 < device.broadcast_efficiency <= 8
    assert 0 < device.optimizer_tensor_s < 1e-2  # a few dozen microseconds per tensor on a CPU
    assert 0 < device.stream_efficiency <= 1 and 0 < device.half_reduce_efficiency <= 8
    assert 0 < spec.provenance["half_wire_efficiency"] <= 8  # the bare fp16 all-reduce, kept to score trials both ways
    assert device.lowrank_round_s is not None and 0 <= device.lowrank_round_s < 0.5
    assert spec.nodes[0].cpus == [0, 1] and spec.nodes[0].address == "127.0.0.1"
    assert spec.compute_devices == ["127.0.0.1:CPU:0", "127.0.0.1:CPU:1"]

    weight = Variable(name="w", shape=[256, 256])
    graph = ModelGraph(
        batch_size=8,
        variables=[weight],
        layers=[
            Layer(
                name="fc",
                kind="matmul",
                fwd_flops=2 * 8 * 256 * 256,
                bwd_flops=4 * 8 * 256 * 256,
                bytes_moved=4 * 256 * 256,
                output_bytes=4 * 8 * 256,
                variables=["w"],
            ),
        ],
    )
    strategy = Strategy(
        replicas=spec.compute_devices, variables=[VariableConfig(var_name="w", synchronizer=AllReduceSynchronizer())]
    )
    prediction = simulate(graph, spec, [strategy])[0]
    assert math.isfinite(prediction.step_time_s) and prediction.step_time_s > 0
    assert prediction.breakdown["compute"] > 0 and prediction.breakdown["allreduce"] >= 0


def bucket_paths(rank: int, world: int, payload: dict) -> dict:
    """Each probe bucket on two parameters of 8 floats whose values and gradients rank r fills with r + 1."""
    from stratagem.calibrate import collectives as probes

    ranks = probes.Ranks.world()

    def pieces() -> list:
        made = probes.probe_pieces(64, parts=2)
        for piece in made:
            piece.param.detach().fill_(rank + 1)
            piece.param.grad.fill_(rank + 1)
        return made

    out: dict = {}
    made = pieces()
    run = probes.stepped(ranks, probes.allreduce_bucket(ranks, made))
    for _ in range(2):  # the bucket's kept buffer, reused: the second step overwrites what the first left there
        run()
    out["allreduce"] = [piece.param.grad.tolist() for piece in made]
    made = pieces()
    probes.stepped(ranks, probes.zero_bucket(ranks, made))()
    out["sharded"] = [piece.param.detach().tolist() for piece in made]
    made = pieces()
    out["push_pull"] = probes.push_and_pull(ranks, probes.ps_bucket(ranks, made), probes.PhaseClock(ranks))
    out["pulled"] = [piece.param.detach().tolist() for piece in made]
    # three repeats: the median rides out one stall of a busy machine, which a single timing cannot
    out["efficiencies"] = [
        *probes.root_efficiencies(ranks, repeats=3),
        probes.scatter_efficiency(ranks, repeats=3),
        probes.gather_efficiency(ranks, repeats=3),
        *probes.half_reduce_efficiencies(ranks, repeats=3),
    ]
    out["lowrank_round_s"] = probes.lowrank_round_seconds(ranks, repeats=3)
    return out


@pytest.mark.slow
def test_the_probes_time_the_runtimes_own_buckets():
    mean = (1 + 2) / 2
    for result in run_ranks("test_simulator_calibration:bucket_paths", 2, timeout_s=120):
        assert result["allreduce"] == [[mean] * 8, [mean] * 8]  # averaged into the gradients
        # ZeRO: each rank's chunk of the values gathered by every rank; the probe's shard update changes nothing
        assert result["sharded"] == [[1.0] * 8, [2.0] * 8]
        assert result["pulled"] == [[1.0] * 8, [1.0] * 8]  # the server's (rank 0's) values, pulled by every rank
        assert all(seconds > 0 for seconds in result["push_pull"])  # the push and the pull, timed apart
        assert all(0 < e < 10 for e in result["efficiencies"])
        assert 0 <= result["lowrank_round_s"] < 0.5  # two real gloo round trips, less the reducer's compute
