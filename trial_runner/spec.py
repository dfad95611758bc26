"""The one document that travels to every rank: what to run, on what, for how long.

It is JSON all the way: the workload spec, the strategy and the resource spec. Workers rebuild the
model from the workload spec, so nothing a caller hands us (an object, a pickle, an import path) is
ever executed on a worker.
"""

from __future__ import annotations

import os
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from stratagem.errors import InvalidDocumentError
from stratagem.ir import ResourceSpec, Strategy
from stratagem.ir.document import problems_from_validation_error
from trial_runner.workloads import FaultWorkload, ReplayWorkload, ZooWorkload

Workload = Annotated[ZooWorkload | ReplayWorkload | FaultWorkload, Field(discriminator="kind")]


class TrialSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workload: Workload
    resources: ResourceSpec
    strategy: Strategy
    warmup: int = Field(default=2, ge=0)
    """Steps run before timing starts (allocator warm-up, lazy initialisation, first communication)."""
    steps: int = Field(default=5, ge=1)
    """Timed steps; every sample is kept."""
    timeout_s: float = Field(default=120.0, gt=0)
    """Hard limit for the whole trial, process start-up included; past it every rank is killed."""
    seed: int = Field(default=0, ge=0)
    """Model initialisation uses `seed`; rank r's batch at step s uses a seed derived from (seed, r, s)."""
    min_stall_s: float = Field(default=10.0, gt=0)
    """A step is declared hung when no rank advanced for max(min_stall_s, stall_factor × slowest step)."""
    stall_factor: float = Field(default=10.0, ge=1)
    threads_per_rank: int | None = Field(default=None, ge=1)
    """Intra-op threads of each CPU rank; by default the host's cores divided among the local ranks."""
    measure_undistributed: bool = True
    """Also time an undistributed replica: the step with no synchronization at all (data-parallel meshes only)."""
    owner: str | None = Field(default=None, max_length=120, pattern=r"^[A-Za-z0-9_.:\-]+$")
    """Who the trial's workers belong to (the service's job id): Ray actors are named for it, so a service
    resuming the job kills whatever a crashed predecessor left (`RayBackend.reap`)."""
    prime_optimizer: bool = True
    """Fill the optimizer state with one undistributed step first, so timed steps see steady state
    (`trial_runner.build.prime_optimizer_state`)."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.workload.kind == "fault" and self.workload.rank is not None and self.workload.rank >= self.world_size:
            raise ValueError(f"workload.rank: {self.workload.rank} is not a rank of a {self.world_size}-rank trial")
        return self

    @property
    def world_size(self) -> int:
        return len(self.strategy.replicas)

    @property
    def global_batch_size(self) -> int:
        """Samples per step over all replicas: the per-replica step times the data-parallel degree."""
        return self.strategy.step_samples(self.workload.batch_size) * self.strategy.effective_mesh.data

    def cpu_threads(self, local_ranks: int) -> int:
        if self.threads_per_rank is not None:
            return self.threads_per_rank
        return max(1, (os.cpu_count() or 1) // max(1, local_ranks))

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def parse(cls, data: str | bytes | dict) -> TrialSpec:
        """Validate JSON or a dict, raising InvalidDocumentError with each field path."""
        try:
            if isinstance(data, (str, bytes)):
                return cls.model_validate_json(data)
            return cls.model_validate(data)
        except ValidationError as error:
            raise InvalidDocumentError(problems_from_validation_error(error), document="trial spec") from None
