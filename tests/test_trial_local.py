"""Trials on real processes (gloo, 2 ranks): measurements of a healthy trial, and every failure as an outcome."""

from __future__ import annotations

import os

import pytest
from sample_documents import make_cpu_cluster

from stratagem import zoo
from stratagem.builders import PS
from stratagem.tracing import capture
from trial_runner import FaultWorkload, LocalBackend, Outcome, ReplayWorkload, ZooWorkload, run_trial

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_healthy_replay_trial_measures_every_step_memory_and_the_sync_split(trial_setup):
    graph, resources, strategy = trial_setup
    result = run_trial(
        ReplayWorkload(graph), resources, strategy, warmup=1, steps=4, timeout=120, backend=LocalBackend()
    )
    assert result.outcome == Outcome.ok, result.error
    assert result.world_size == 2 and result.backend == "local" and result.workload == "replay:mlp"
    assert len(result.step_times_s) == 4 and all(t > 0 for t in result.step_times_s)
    assert [len(r.step_times_s) for r in result.ranks] == [4, 4] and [len(r.warmup_times_s) for r in result.ranks] == [
        1,
        1,
    ]
    assert result.step_times_s == [
        max(a, b) for a, b in zip(result.ranks[0].step_times_s, result.ranks[1].step_times_s, strict=True)
    ]
    assert result.p90_s >= result.median_s > 0
    assert result.samples_per_s == pytest.approx(16 / result.median_s)
    assert all(peak > 100e6 for peak in result.peak_memory_bytes)  # RSS high-water: interpreter, torch, model
    assert result.sync_wait_s is not None and result.sync_wait_s >= 0
    assert result.compute_s is not None and result.compute_s > 0
    assert result.undistributed_step_s is not None and result.undistributed_step_s > 0
    assert result.optimizer_primed and all(r.optimizer_primed for r in result.ranks)
    assert all(r.wire_bytes.get("allreduce", 0) >= graph.parameter_bytes for r in result.ranks)
    measured = result.to_measured()
    assert strategy.replace(measured=measured).id == strategy.id


def test_a_zoo_model_trains_under_a_parameter_server_strategy():
    module, make_batch = zoo.build("gpt", "small")
    graph = capture(module, make_batch(4), batch_size=4, optimizer="adam")
    resources = make_cpu_cluster(2)
    result = run_trial(
        ZooWorkload("gpt", batch_size=4),
        resources,
        PS().build(graph, resources),
        warmup=1,
        steps=2,
        timeout=120,
        measure_undistributed=False,
    )
    assert result.outcome == Outcome.ok, result.error
    assert result.workload == "zoo:gpt" and len(result.step_times_s) == 2
    assert all("ps" in r.wait_by_kind_s for r in result.ranks)


def test_a_graph_that_clips_refuses_asynchronous_servers_in_its_trial(trial_setup):
    """The trial passes the graph's clip norm to the runtime, which refuses ASP with the reason."""
    graph, resources, _ = trial_setup
    clipped = graph.replace(optimizer=graph.optimizer.model_copy(update={"max_grad_norm": 1.0}))
    asp = PS(sync=False).build(clipped, resources)
    result = run_trial(ReplayWorkload(clipped), resources, asp, warmup=0, steps=1, timeout=120)
    assert result.outcome == Outcome.invalid
    assert "asynchronous parameter server" in result.error


def test_a_strategy_for_another_model_is_refused_by_the_runtime_as_invalid(trial_setup):
    _, resources, strategy = trial_setup  # names fc1.weight ..., which gpt does not have
    result = run_trial(ZooWorkload("gpt", batch_size=2), resources, strategy, warmup=0, steps=1, timeout=120)
    assert result.outcome == Outcome.invalid
    assert "fc1.weight" in result.error


def test_a_rank_that_raises_is_a_crash_with_its_error_and_its_peer_is_stopped(trial_setup):
    graph, resources, strategy = trial_setup
    workload = FaultWorkload(inner=ReplayWorkload(graph), fault="raise", rank=1, step=1)
    result = run_trial(workload, resources, strategy, warmup=1, steps=3, timeout=120)
    assert result.outcome == Outcome.crash and result.failed_rank == 1
    assert "RuntimeError: injected fault" in result.error
    assert result.wall_s < 60


def test_an_absurd_allocation_is_an_oom_outcome(trial_setup):
    graph, resources, strategy = trial_setup
    workload = FaultWorkload(inner=ReplayWorkload(graph), fault="oom", rank=0, step=0)
    result = run_trial(workload, resources, strategy, warmup=1, steps=2, timeout=120)
    assert result.outcome == Outcome.oom and result.failed_rank == 0
    assert "can't allocate memory" in result.error


def test_a_rank_that_dies_without_a_report_is_a_crash_with_its_exit_status(trial_setup):
    graph, resources, strategy = trial_setup
    workload = FaultWorkload(inner=ReplayWorkload(graph), fault="exit", rank=1, step=1)
    result = run_trial(workload, resources, strategy, warmup=1, steps=2, timeout=120)
    assert result.outcome == Outcome.crash and result.failed_rank == 1
    assert "exited with status 17" in result.error


def test_a_rank_that_sleeps_forever_is_a_timeout_and_every_process_is_killed(trial_setup):
    graph, resources, strategy = trial_setup
    backend = LocalBackend()
    workload = FaultWorkload(inner=ReplayWorkload(graph), fault="hang", rank=1, step=None)
    result = run_trial(workload, resources, strategy, timeout=12, backend=backend)
    assert result.outcome == Outcome.timeout
    assert "12 s time limit" in result.error
    assert 12 <= result.wall_s < 30
    assert len(backend.last_pids) == 2 and not any(_alive(pid) for pid in backend.last_pids)


def test_a_step_that_stops_advancing_is_a_hang_long_before_the_time_limit(trial_setup):
    graph, resources, strategy = trial_setup
    workload = FaultWorkload(inner=ReplayWorkload(graph), fault="hang", rank=1, step=3)
    result = run_trial(workload, resources, strategy, warmup=1, steps=4, timeout=300, min_stall_s=3.0)
    assert result.outcome == Outcome.hang
    assert "no progress" in result.error and "at step 3" in result.error
    assert result.wall_s < 60
