"""Every way a rank starts (launch, the local and Ray trial backends, calibration) gets the allocator settings."""

from __future__ import annotations

from stratagem.rank_env import MALLOC_SETTINGS, rank_environment
from trial_runner.backends.ray_backend import rank_runtime_env


def test_defaults_fill_in_only_what_the_environment_lacks() -> None:
    env = rank_environment({"PATH": "/bin", "MALLOC_MMAP_THRESHOLD_": "65536"}, OMP_NUM_THREADS="1")
    assert env == {"PATH": "/bin", **MALLOC_SETTINGS, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}


def test_ray_rank_actors_carry_only_the_allocator_settings(monkeypatch) -> None:
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "777")
    assert rank_runtime_env() == {"env_vars": {**MALLOC_SETTINGS, "MALLOC_TRIM_THRESHOLD_": "777"}}
