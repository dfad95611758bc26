"""Trials through a real local Ray: one placement group, one actor per rank, everything released after."""

from __future__ import annotations

import time

import pytest

from trial_runner import FaultWorkload, Outcome, ReplayWorkload, run_trial

pytestmark = pytest.mark.slow


def _cpus_back(ray, expected: float = 2.0, within_s: float = 15.0) -> bool:
    """Ray returns a removed group's resources asynchronously; give it a moment."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if ray.available_resources().get("CPU") == expected:
            return True
        time.sleep(0.2)
    return False


def _groups_left(ray) -> list[str]:
    return [g["placement_group_id"] for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]


def test_a_healthy_trial_runs_one_actor_per_rank_and_releases_the_placement_group(ray_backend, trial_setup):
    backend, ray = ray_backend
    graph, resources, strategy = trial_setup
    result = run_trial(ReplayWorkload(graph), resources, strategy, warmup=1, steps=3, timeout=120, backend=backend)
    assert result.outcome == Outcome.ok, result.error
    assert result.backend == "ray" and result.world_size == 2
    assert len(result.step_times_s) == 3 and result.samples_per_s > 0
    assert all(peak and peak > 0 for peak in result.peak_memory_bytes)
    assert _groups_left(ray) == []
    assert _cpus_back(ray)


def test_a_trial_past_its_time_limit_has_its_actors_killed_and_its_placement_group_removed(ray_backend, trial_setup):
    backend, ray = ray_backend
    graph, resources, strategy = trial_setup
    workload = FaultWorkload(inner=ReplayWorkload(graph), fault="hang", step=None)
    result = run_trial(workload, resources, strategy, timeout=20, backend=backend)
    assert result.outcome == Outcome.timeout
    assert "time limit" in result.error
    assert _groups_left(ray) == []
    assert _cpus_back(ray)
    assert len(backend.last_actors) == 2
    for actor in backend.last_actors:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.progress.remote(), timeout=30)
