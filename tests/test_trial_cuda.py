"""Trials on a CUDA device with NCCL, the paths CI's CPU machines never run. The machine lent for GPU
checks has one GPU, so every trial has one rank; skipped where torch sees no CUDA device."""

from __future__ import annotations

import math

import pytest
import torch
from sample_documents import make_mlp_graph

from stratagem.builders import AllReduce, all_builders
from stratagem.calibrate import calibrate_gpu
from stratagem.ir import Compressor, Node, ResourceSpec, Strategy
from stratagem.ir.catalog import CATALOG
from stratagem.runtime.comm import Team
from stratagem.runtime.compression import CastReducer, PowerSGDReducer, TopKReducer
from trial_runner import LocalBackend, Outcome, ReplayWorkload, run_trial

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def one_gpu() -> ResourceSpec:
    return ResourceSpec(name="gpu-1x1", nodes=[Node(address="127.0.0.1", chief=True, gpus=[0], device="H100")])


def compressed(strategy: Strategy, compressor: Compressor) -> Strategy:
    variables = [
        v.model_copy(update={"synchronizer": v.synchronizer.model_copy(update={"compressor": compressor})})
        for v in strategy.variables
    ]
    return strategy.replace(variables=variables)


def _trial(strategy: Strategy, resources: ResourceSpec) -> None:
    graph = make_mlp_graph(batch_size=8, widths=(256, 256, 10))
    result = run_trial(
        ReplayWorkload(graph), resources, strategy, warmup=1, steps=3, timeout=300, backend=LocalBackend()
    )
    assert result.outcome == Outcome.ok, result.error
    assert [r.device for r in result.ranks] == ["cuda:0"]
    assert len(result.step_times_s) == 3 and all(t > 0 for t in result.step_times_s)
    assert result.peak_memory_bytes[0] > 0  # the CUDA allocator's high-water mark, not the process's RSS


@pytest.mark.parametrize("builder", all_builders(), ids=lambda b: type(b).__name__)
def test_every_builder_trains_on_a_gpu_over_nccl(builder):
    graph, resources = make_mlp_graph(batch_size=8, widths=(256, 256, 10)), one_gpu()
    _trial(builder.build(graph, resources), resources)


@pytest.mark.parametrize(
    "compressor",
    [
        Compressor(kind="fp16"),
        Compressor(kind="bf16"),
        Compressor(kind="powersgd", rank=4),
        Compressor(kind="topk", ratio=0.01),
    ],
    ids=lambda c: c.kind,
)
def test_compressed_all_reduce_trains_on_a_gpu_over_nccl(compressor):
    graph, resources = make_mlp_graph(batch_size=8, widths=(256, 256, 10)), one_gpu()
    _trial(compressed(AllReduce().build(graph, resources), compressor), resources)


@pytest.mark.parametrize(
    "reducer",
    [
        lambda team: CastReducer(team, wire_dtype=torch.float16, error_feedback=True),
        lambda team: TopKReducer(team, ratio=1.0, error_feedback=True),
        lambda team: PowerSGDReducer(team, rank=64, error_feedback=True, seed=0),
    ],
    ids=["fp16", "topk-all", "powersgd-full-rank"],
)
def test_a_reducer_on_cuda_returns_cuda_gradients_of_the_right_shape(reducer):
    grads = [torch.randn(64, 64, device="cuda"), torch.randn(64, device="cuda")]
    team = reducer(Team([0], [0], None))
    team.start(grads)
    out = team.finish()
    assert [g.device.type for g in out] == ["cuda", "cuda"] and [g.shape for g in out] == [g.shape for g in grads]
    torch.testing.assert_close(out[0], grads[0], rtol=1e-2, atol=1e-2)  # lossless at this size, up to fp16 rounding


def test_a_real_gpu_calibrates_into_figures_near_its_kind():
    spec = calibrate_gpu(0)
    device = spec.devices[spec.nodes[0].device]
    catalog = CATALOG.get(spec.nodes[0].device.removesuffix("-calibrated"))
    assert device.is_gpu and 0 < device.launch_overhead_s < 1e-3
    assert all(math.isfinite(v) and v > 0 for v in (*device.peak_flops.values(), device.memory_bandwidth))
    if catalog is not None:  # a kernel reaches a share of the data sheet, never more than it
        assert 0.2 * catalog.memory_bandwidth < device.memory_bandwidth < 1.1 * catalog.memory_bandwidth
        assert (
            0.2 * catalog.peak_flops["bfloat16"] < device.peak_flops["bfloat16"] < 1.1 * catalog.peak_flops["bfloat16"]
        )
        if "float8" in catalog.peak_flops:  # Hopper and later: scaled fp8 GEMMs measured too
            assert 0.2 * catalog.peak_flops["float8"] < device.peak_flops["float8"] < 1.1 * catalog.peak_flops["float8"]
        if "tf32" in catalog.peak_flops:  # Ampere and later: TF32 GEMMs on tensor cores
            assert 0.2 * catalog.peak_flops["tf32"] < device.peak_flops["tf32"] < 1.1 * catalog.peak_flops["tf32"]


def test_step_stats_on_cuda_leave_the_host_free_to_queue_ahead():
    """The recorder marks its boundaries with stream events: the host returns from a step long before the
    device has run it, and the spans it reports afterwards are the device's."""
    import time

    from stratagem.runtime.stats import StatsRecorder

    recorder = StatsRecorder(torch.device("cuda"))
    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    started = time.perf_counter()
    recorder.begin_step()
    with recorder.waiting("allreduce"):
        for _ in range(200):
            a = torch.tanh(a @ a)
    recorder.end_step()
    host = time.perf_counter() - started
    stats = recorder.last
    assert stats is not None and stats.step == 1
    assert host < 0.5 * stats.step_s, (host, stats.step_s)
    assert 0.9 * stats.step_s < stats.wait_s["allreduce"] <= stats.step_s
