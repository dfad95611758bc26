"""How a trial ends: the supervisor's deadline, stall and failure rules, and the root cause it reports.

These run on a virtual clock with scripted ranks, so every rule is exercised exactly and instantly;
the real processes and actors are exercised in test_trial_local.py and test_trial_ray.py.
"""

from __future__ import annotations

import pytest
import torch
from sample_documents import make_cpu_cluster, make_mlp_graph

from stratagem.builders import DataParallel
from stratagem.errors import InvalidStrategyError, UnsupportedStrategyError
from trial_runner.result import Outcome, Progress, RankReport
from trial_runner.spec import TrialSpec
from trial_runner.summary import root_cause
from trial_runner.supervise import Supervisor
from trial_runner.worker import classify
from trial_runner.workloads import ReplayWorkload


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class ScriptedRank:
    """A rank whose progress and end follow a script: [(time, Progress)], then `finish` at `ends_at`."""

    def __init__(
        self,
        rank: int,
        clock: VirtualClock,
        script: list[tuple[float, Progress]],
        ends_at: float | None = None,
        finish: RankReport | None = None,
    ) -> None:
        self.rank, self.clock, self.script = rank, clock, script
        self.ends_at, self.finish = ends_at, finish
        self.killed_at: float | None = None

    def poll(self) -> RankReport | None:
        if self.killed_at is None and self.ends_at is not None and self.clock.now >= self.ends_at:
            return self.finish or RankReport(rank=self.rank, phase="done", finished_at=self.ends_at)
        return None

    def progress(self) -> Progress | None:
        seen = [progress for at, progress in self.script if at <= self.clock.now]
        return seen[-1] if seen else None

    def kill(self) -> None:
        self.killed_at = self.clock.now


def _spec(**options) -> TrialSpec:
    graph = make_mlp_graph(batch_size=4, widths=(8, 8, 2))
    resources = make_cpu_cluster(2)
    return TrialSpec(
        workload=ReplayWorkload(graph), resources=resources, strategy=DataParallel().build(graph, resources), **options
    )


def _steps(start: float, every: float, count: int) -> list[tuple[float, Progress]]:
    """Steps of `every` seconds from `start`; each rank reports its slowest step so far."""
    return [(start + every * i, Progress("warmup" if i <= 2 else "timed", i, every)) for i in range(1, count + 1)]


def _watch(spec: TrialSpec, ranks: list[ScriptedRank], clock: VirtualClock, grace: float = 3.0) -> list[RankReport]:
    return Supervisor(spec, poll_interval_s=0.1, failure_grace_s=grace, clock=clock, sleep=clock.sleep).watch(ranks)


def test_ranks_that_all_finish_end_the_trial_without_kills():
    clock = VirtualClock()
    ranks = [ScriptedRank(r, clock, _steps(1.0, 0.5, 7), ends_at=5.0) for r in range(2)]
    reports = _watch(_spec(), ranks, clock)
    assert [r.outcome for r in reports] == [Outcome.ok, Outcome.ok]
    assert all(rank.killed_at is None for rank in ranks)
    assert root_cause(reports) is None


def test_a_rank_stuck_before_its_first_step_is_a_timeout_at_the_deadline():
    clock = VirtualClock()
    ranks = [ScriptedRank(r, clock, [(0.5, Progress("build", 0))]) for r in range(2)]
    reports = _watch(_spec(timeout_s=30.0), ranks, clock)
    assert all(rank.killed_at == pytest.approx(30.0, abs=0.2) for rank in ranks)
    assert {r.outcome for r in reports} == {Outcome.timeout}
    assert all(r.killed and "30 s time limit" in (r.error or "") and "build" in (r.error or "") for r in reports)


def test_steps_that_stop_advancing_are_a_hang_long_before_the_deadline():
    clock = VirtualClock()
    ranks = [ScriptedRank(r, clock, _steps(1.0, 0.5, 3)) for r in range(2)]  # last step at t=2.5, then silence
    reports = _watch(_spec(timeout_s=600.0, min_stall_s=4.0, stall_factor=10.0), ranks, clock)
    # slowest step 0.5 s -> limit max(4, 10 * 0.5) = 5 s after the last step
    assert ranks[0].killed_at == pytest.approx(7.5, abs=0.2)
    assert {r.outcome for r in reports} == {Outcome.hang}
    assert "at step 3" in (reports[0].error or "")


def test_the_yardstick_is_the_ranks_own_step_time_even_when_the_supervisor_missed_every_step():
    clock = VirtualClock()
    # the supervisor first looks at t=5: the rank already did three 0.2 s steps and has been stuck since
    ranks = [ScriptedRank(r, clock, [(5.0, Progress("timed", 3, 0.2))]) for r in range(2)]
    reports = _watch(_spec(timeout_s=600.0, min_stall_s=3.0), ranks, clock)
    assert {r.outcome for r in reports} == {Outcome.hang}
    assert ranks[0].killed_at == pytest.approx(8.0, abs=0.2)


def test_slow_but_steady_steps_are_not_a_hang():
    clock = VirtualClock()
    ranks = [ScriptedRank(r, clock, _steps(1.0, 3.0, 7), ends_at=23.0) for r in range(2)]
    reports = _watch(_spec(timeout_s=600.0, min_stall_s=2.0, stall_factor=2.0), ranks, clock)
    assert [r.outcome for r in reports] == [Outcome.ok, Outcome.ok]


def test_peers_of_a_failed_rank_are_killed_after_the_grace_period():
    clock = VirtualClock()
    failure = RankReport(rank=1, outcome=Outcome.crash, error="ValueError: boom", finished_at=2.0)
    ranks = [
        ScriptedRank(0, clock, _steps(1.0, 0.5, 2)),
        ScriptedRank(1, clock, _steps(1.0, 0.5, 2), ends_at=2.0, finish=failure),
    ]
    reports = _watch(_spec(timeout_s=600.0, min_stall_s=100.0), ranks, clock, grace=3.0)
    assert ranks[0].killed_at == pytest.approx(5.0, abs=0.2)
    assert reports[0].killed and "after rank 1 failed" in (reports[0].error or "")
    cause = root_cause(reports)
    assert cause is not None and cause.rank == 1 and cause.error == "ValueError: boom"


def test_root_cause_prefers_an_out_of_memory_over_the_crash_it_causes_in_a_peer():
    echo = RankReport(rank=0, outcome=Outcome.crash, error="Connection closed by peer", finished_at=10.0)
    oom = RankReport(rank=1, outcome=Outcome.oom, error="out of memory", finished_at=10.2)
    assert root_cause([echo, oom]) is oom


def test_root_cause_prefers_a_rank_own_error_over_a_kill_and_the_earliest_among_equals():
    killed = RankReport(rank=0, outcome=Outcome.crash, killed=True, error="killed", finished_at=1.0)
    late = RankReport(rank=1, outcome=Outcome.crash, error="late", finished_at=9.0)
    early = RankReport(rank=2, outcome=Outcome.crash, error="early", finished_at=5.0)
    assert root_cause([killed, late, early]) is early


@pytest.mark.parametrize(
    "error,outcome",
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), Outcome.oom),
        (MemoryError(), Outcome.oom),
        (
            RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1125899906842624 bytes"),
            Outcome.oom,
        ),
        (UnsupportedStrategyError("mesh.tensor > 1 is not supported"), Outcome.invalid),
        (InvalidStrategyError("variables: no synchronizer for 'w'"), Outcome.invalid),
        (ValueError("shapes do not match"), Outcome.crash),
        (RuntimeError("Connection closed by peer"), Outcome.crash),
    ],
)
def test_exceptions_are_classified_into_outcomes_with_their_text(error, outcome):
    got, text = classify(error)
    assert got == outcome
    assert type(error).__name__ in text


def test_root_cause_prefers_a_rank_that_died_over_the_connection_error_its_peer_saw_first():
    echo = RankReport(
        rank=0,
        outcome=Outcome.crash,
        peer_lost=True,
        finished_at=1.00,
        error="RuntimeError: Read error [127.0.0.1]:56216: Connection reset by peer",
    )
    died = RankReport(
        rank=1, outcome=Outcome.crash, error="the rank exited with status 17 without a report", finished_at=1.05
    )
    assert root_cause([echo, died]) is died


def test_a_collective_broken_by_a_vanished_peer_is_recognised_as_an_echo():
    from trial_runner.worker import is_peer_lost

    assert is_peer_lost(
        RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:8105: Connection reset by peer.")
    )
    assert not is_peer_lost(RuntimeError("injected fault: this rank raised on purpose"))
