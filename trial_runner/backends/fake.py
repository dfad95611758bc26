"""A deterministic backend for tests of the service: no processes, answers from a given function."""

from __future__ import annotations

from collections.abc import Callable

from trial_runner.result import Outcome, RankReport, TrialResult
from trial_runner.spec import TrialSpec
from trial_runner.summary import now_utc, summarize

FakeAnswer = TrialResult | float | Outcome
"""A full result, a step time in seconds (an `ok` trial), or a failing outcome."""


class FakeBackend:
    """Clearly not a measurement: every rank "takes" the step time the function returns, every step."""

    name = "fake"

    def __init__(self, respond: Callable[[TrialSpec], FakeAnswer]) -> None:
        self.respond = respond
        self.calls: list[TrialSpec] = []

    def run(self, spec: TrialSpec) -> TrialResult:
        self.calls.append(spec)
        answer = self.respond(spec)
        if isinstance(answer, TrialResult):
            return answer
        if isinstance(answer, Outcome):
            return fake_result(spec, outcome=answer)
        return fake_result(spec, step_time_s=float(answer))


def fake_result(spec: TrialSpec, *, step_time_s: float = 0.0, outcome: Outcome = Outcome.ok) -> TrialResult:
    started = now_utc()
    if outcome == Outcome.ok:
        if step_time_s <= 0:
            raise ValueError(f"step_time_s: an ok fake trial needs a positive step time, got {step_time_s}")
        reports = [
            RankReport(
                rank=r,
                phase="done",
                warmup_times_s=[step_time_s] * spec.warmup,
                step_times_s=[step_time_s] * spec.steps,
                finished_at=started.timestamp(),
            )
            for r in range(spec.world_size)
        ]
    else:
        reports = [RankReport(rank=0, outcome=outcome, error=f"fake {outcome.value}", finished_at=started.timestamp())]
        reports += [
            RankReport(rank=r, outcome=Outcome.crash, killed=True, error="killed after rank 0 failed")
            for r in range(1, spec.world_size)
        ]
    return summarize(spec, reports, backend=FakeBackend.name, started=started, finished=started)
