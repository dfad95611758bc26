"""Ways to run a trial: local processes, a Ray cluster, or a deterministic fake for tests."""

from trial_runner.backends.base import TrialBackend
from trial_runner.backends.fake import FakeBackend, fake_result
from trial_runner.backends.local import LocalBackend
from trial_runner.backends.ray_backend import RayBackend

__all__ = ["FakeBackend", "LocalBackend", "RayBackend", "TrialBackend", "fake_result"]
