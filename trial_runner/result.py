"""What a trial hands back: an outcome, every timed sample and a summary, as plain JSON.

A trial that fails is still a result. Out-of-memory, crashes, hangs and timeouts are outcomes with
their error text, because the service records them as rows and the cost model learns from them;
only `to_measured()` refuses a failed trial, since a failure has no step time to report.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from stratagem.errors import TrialFailedError
from stratagem.ir import MeasuredPerformance


class Outcome(StrEnum):
    ok = "ok"
    oom = "oom"
    """A rank ran out of memory: its allocator said so (CUDA or the host), or the kernel's OOM killer acted."""
    crash = "crash"
    """A rank raised or died."""
    killed = "killed"
    """A rank was killed by a signal no one explained (SIGKILL without the kernel counting an OOM kill)."""
    timeout = "timeout"
    """The trial ran past its time limit while still making progress, or before its first step."""
    hang = "hang"
    """A step stopped making progress: no rank advanced for far longer than any earlier step took."""
    invalid = "invalid"
    """The strategy, workload or cluster were refused before or while being applied."""


class Progress(NamedTuple):
    """What a rank announces whenever it moves on; the supervisor watches it for stalls."""

    phase: str
    step: int
    """Steps completed, warm-up included."""
    slowest_step_s: float = 0.0
    """The longest step so far: the yardstick for declaring a later step hung."""


class _Plain(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RankReport(_Plain):
    """What one rank measured; the supervisor fills `outcome` for ranks it had to kill."""

    rank: int = Field(ge=0)
    outcome: Outcome = Outcome.ok
    error: str | None = None
    phase: str = "start"
    """The last phase the rank reached: start, init, build, distribute, warmup, timed, undistributed, done."""
    optimizer_primed: bool = False
    """Whether the rank filled its optimizer state before timing (`TrialSpec.prime_optimizer`; meshes never do)."""
    warmup_times_s: list[float] = Field(default_factory=list)
    step_times_s: list[float] = Field(default_factory=list)
    sync_wait_times_s: list[float] = Field(default_factory=list)
    """Per timed step: seconds blocked on synchronization, as the runtime reports it."""
    wait_by_kind_s: dict[str, float] = Field(default_factory=dict)
    """Mean blocked seconds per step, per synchronizer kind (allreduce, ps, sharded)."""
    wire_bytes: dict[str, int] = Field(default_factory=dict)
    """Bytes this rank handed to collectives in the last timed step, per synchronizer kind."""
    undistributed_times_s: list[float] = Field(default_factory=list)
    """Step times of an undistributed replica of the same model on the same batches."""
    peak_memory_bytes: float | None = None
    baseline_memory_bytes: float | None = None
    """Memory before the model was built (interpreter, torch, communication buffers)."""
    device: str = "cpu"
    killed: bool = False
    peer_lost: bool = False
    """The rank's error is another rank's failure seen through a collective (connection reset or closed)."""
    """The supervisor stopped this rank (deadline, stall, or a peer's failure)."""
    finished_at: float | None = None
    """Seconds since the epoch when the rank stopped, to tell the first failure from its echoes."""


class TrialResult(_Plain):
    outcome: Outcome
    error: str | None = None
    """The first failing rank's error, prefixed with its rank."""
    failed_rank: int | None = None
    world_size: int = Field(ge=1)
    backend: str
    workload: str
    """The workload's short name, e.g. `zoo:resnet50` or `replay:<graph name>`."""
    strategy_id: str | None = None
    resources_id: str | None = None
    global_batch_size: int = Field(default=0, ge=0)
    step_times_s: list[float] = Field(default_factory=list)
    """Timed steps; each sample is the slowest rank's time for that step."""
    median_s: float | None = None
    p90_s: float | None = None
    samples_per_s: float | None = None
    peak_memory_bytes: list[float | None] = Field(default_factory=list)
    """Per rank: RSS high-water mark on CPU, `max_memory_allocated` on GPU."""
    compute_s: float | None = None
    """Median step time not spent blocked on synchronization (slowest rank); from the runtime's
    per-step figures, else the undistributed replica's step time."""
    sync_wait_s: float | None = None
    """Median time a step spent blocked on synchronization (slowest rank); from the runtime's figures,
    else `median_s - undistributed_step_s`."""
    undistributed_step_s: float | None = None
    """Median step of the same model with no strategy applied: the step's cost without any synchronization."""
    optimizer_primed: bool = False
    """Every rank timed its steps over primed optimizer state; measurements under the two protocols differ."""
    ranks: list[RankReport] = Field(default_factory=list)
    started_at: str
    finished_at: str
    wall_s: float = Field(ge=0)

    @property
    def ok(self) -> bool:
        return self.outcome == Outcome.ok

    def to_measured(self) -> MeasuredPerformance:
        """The measurement a Strategy carries; a failed trial has none and raises TrialFailedError."""
        if not self.ok or self.median_s is None or self.median_s <= 0:
            raise TrialFailedError(f"trial ended with outcome {self.outcome.value!r}: {self.error or 'no timed steps'}")
        peaks = [p for p in self.peak_memory_bytes if p is not None]
        return MeasuredPerformance(
            step_time_s=self.median_s,
            step_time_p90_s=self.p90_s,
            samples_per_s=self.samples_per_s or 0.0,
            peak_memory_bytes=max(peaks) if peaks else None,
            trials=1,
        )

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def parse(cls, text: str | bytes) -> TrialResult:
        return cls.model_validate_json(text)
