"""Watch the ranks of one trial and stop them when it has to end: done, failed, stalled or late.

Backends differ in how a rank runs (a process, a Ray actor); they all hand the supervisor handles
with the same three operations, so deadline, stall and failure rules are written once.

- Every rank reported: done.
- A rank failed: its peers get `failure_grace_s` to report their own error (often the same failure
  seen from the other side of a collective), then they are killed.
- No rank advanced for max(min_stall_s, stall_factor × the slowest step any rank reported): `hang`.
  Before the first step there is no yardstick, so only the deadline applies. Ranks report their own
  step times, so the yardstick does not depend on how often the supervisor happens to look.
- The deadline passed: `timeout`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from trial_runner.result import Outcome, Progress, RankReport
from trial_runner.spec import TrialSpec

STEP_PHASES = frozenset({"warmup", "timed"})


class RankHandle(Protocol):
    rank: int

    def poll(self) -> RankReport | None:
        """The rank's report once it has stopped (exited, died or returned), else None."""

    def progress(self) -> Progress | None:
        """The last progress the rank announced, if any."""

    def kill(self) -> None:
        """Stop the rank and everything it started, now."""


@dataclass
class _Watch:
    phase: str = "start"
    step: int = -1
    changed_at: float = 0.0
    slowest_step_s: float = 0.0
    report: RankReport | None = None


@dataclass
class Supervisor:
    spec: TrialSpec
    poll_interval_s: float = 0.1
    failure_grace_s: float = 3.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def watch(self, handles: Sequence[RankHandle], *, started: float | None = None) -> list[RankReport]:
        """Block until the trial ends; return one report per rank, killed ranks included."""
        start = self.clock() if started is None else started
        watches = {h.rank: _Watch(changed_at=start) for h in handles}
        failed_at: float | None = None
        while True:
            now = self.clock()
            for handle in handles:
                watch = watches[handle.rank]
                if watch.report is None:
                    watch.report = handle.poll()
                    self._observe(watch, handle.progress(), now)
            running = [h for h in handles if watches[h.rank].report is None]
            if not running:
                break
            if failed_at is None and any(
                w.report is not None and w.report.outcome != Outcome.ok for w in watches.values()
            ):
                failed_at = now
            verdict = self._verdict(watches, running, start, now, failed_at)
            if verdict is not None:
                outcome, reason = verdict
                for handle in running:
                    handle.kill()
                    watches[handle.rank].report = RankReport(
                        rank=handle.rank,
                        outcome=outcome,
                        error=reason,
                        killed=True,
                        phase=watches[handle.rank].phase,
                        finished_at=time.time(),
                    )
                break
            self.sleep(self.poll_interval_s)
        reports = {rank: w.report for rank, w in watches.items() if w.report is not None}  # every rank, by now
        return [reports[h.rank] for h in sorted(handles, key=lambda h: h.rank)]

    def _observe(self, watch: _Watch, progress: Progress | None, now: float) -> None:
        """The stall clock restarts whenever a rank moves on; its own step times are the yardstick."""
        if progress is None:
            return
        watch.slowest_step_s = max(watch.slowest_step_s, progress.slowest_step_s)
        if (progress.phase, progress.step) != (watch.phase, watch.step):
            watch.phase, watch.step, watch.changed_at = progress.phase, progress.step, now

    def _verdict(
        self, watches: dict[int, _Watch], running: list[RankHandle], start: float, now: float, failed_at: float | None
    ) -> tuple[Outcome, str] | None:
        if failed_at is not None and now - failed_at >= self.failure_grace_s:
            first = min(
                (w.report for w in watches.values() if w.report is not None and w.report.outcome != Outcome.ok),
                key=lambda r: r.finished_at or 0.0,
            )
            return Outcome.crash, f"killed {self.failure_grace_s:.0f} s after rank {first.rank} failed"
        if now - start >= self.spec.timeout_s:
            where = ", ".join(f"rank {h.rank} in {watches[h.rank].phase}" for h in running)
            return Outcome.timeout, f"killed after the {self.spec.timeout_s:g} s time limit ({where})"
        slowest = max(w.slowest_step_s for w in watches.values())
        if slowest <= 0:
            return None
        limit = max(self.spec.min_stall_s, self.spec.stall_factor * slowest)
        stalled = [
            h.rank
            for h in running
            if watches[h.rank].phase in STEP_PHASES and now - watches[h.rank].changed_at >= limit
        ]
        if stalled and len(stalled) == len([h for h in running if watches[h.rank].phase in STEP_PHASES]):
            steps = ", ".join(f"rank {r} at step {watches[r].step}" for r in stalled)
            return Outcome.hang, (f"no progress for {limit:.1f} s (slowest step so far {slowest:.2f} s): {steps}")
        return None
