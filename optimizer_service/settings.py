"""The service's one configuration object, read from the environment.

Every field can be set as `STRATAGEM_<FIELD>`; the database and Ray addresses also honour the plain
`DATABASE_URL` and `RAY_ADDRESS` that container platforms and Ray itself use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MAX_WORKERS = 16

TrialsBackend = Literal["ray", "local", "none"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STRATAGEM_", extra="ignore", validate_default=True)

    database_url: str = Field(
        default="sqlite:///./stratagem.db",
        validation_alias=AliasChoices("STRATAGEM_DATABASE_URL", "DATABASE_URL", "database_url"),
    )
    """SQLAlchemy URL; `postgresql://` and `postgres://` mean the psycopg 3 driver."""
    ray_address: str | None = Field(
        default=None, validation_alias=AliasChoices("STRATAGEM_RAY_ADDRESS", "RAY_ADDRESS", "ray_address")
    )
    """Ray cluster for trials; None runs no trials unless `trials_backend` is `local`."""
    trials_backend: TrialsBackend | None = None
    """Where trials run; None means `ray` when a Ray address is set, else `none`."""
    run_migrations: bool = True
    """Bring the schema to the newest revision at start-up (under an advisory lock on PostgreSQL)."""

    api_key: SecretStr | None = None
    """When set, writes need `Authorization: Bearer <key>`."""
    read_requires_key: bool = False
    """Also require the key for reads (only meaningful with `api_key`)."""

    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    max_queue_length: int = Field(default=100, ge=1)
    """Queued jobs beyond which `POST /v1/optimize` answers 429."""
    retry_after_s: int = Field(default=10, ge=1)
    job_timeout_s: float = Field(default=1800.0, gt=0)
    wait_max_s: float = Field(default=300.0, gt=0)
    """Longest `?wait=true` a request may hold a connection."""

    workers: int = Field(default=1, ge=0, le=MAX_WORKERS)
    """Worker threads claiming jobs in this process; 0 makes an API-only replica. Each holds a database
    connection while it works, and the pool (20 connections, `db.make_engine`) must keep some for the API, so more
    workers means more replicas (docs/deploy.md), not more threads in one."""
    poll_interval_s: float = Field(default=1.0, gt=0)
    heartbeat_interval_s: float = Field(default=5.0, gt=0)
    stale_after_s: float = Field(default=60.0, gt=0)
    """A running job whose heartbeat is older than this lost its worker."""
    max_attempts: int = Field(default=2, ge=1)
    """Claims of one job before a lost worker fails it instead of requeueing it."""
    progress_interval_s: float = Field(default=0.5, ge=0)
    """Least time between two progress writes of one job (phase changes are always written)."""

    max_trials: int = Field(default=4, ge=0)
    trial_warmup: int = Field(default=2, ge=0)
    trial_steps: int = Field(default=5, ge=1)
    trial_timeout_s: float = Field(default=120.0, gt=0)

    search_time_budget_s: float = Field(default=2.0, gt=0)
    search_max_candidates: int = Field(default=20000, ge=1)
    search_top_k: int = Field(default=5, ge=1)
    search_seed: int = 0

    cost_model_enabled: bool = True
    """Learn from trials: train `simulator.learned`'s cost model when no trainer is injected, retrain it
    in the workers and rank candidates with the version in use. False: the simulator alone ranks."""
    cost_model_retrain_every: int = Field(default=20, ge=0)
    """Retrain after a job once this many successful trials arrived since the version in use; 0 never
    retrains on its own (`POST /v1/cost-model/retrain` still does)."""

    @field_validator("api_key", mode="before")
    @classmethod
    def _blank_key_is_no_key(cls, key: object) -> object:
        """docker-compose.yml passes `${STRATAGEM_API_KEY:-}`, an empty string when no key is chosen; read as a
        key, it would lock every write behind a secret no client can send (HTTP Bearer has no empty token)."""
        if isinstance(key, str) and not key.strip():
            return None
        return key

    @field_validator("database_url")
    @classmethod
    def _psycopg_driver(cls, url: str) -> str:
        for prefix in ("postgres://", "postgresql://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url.removeprefix(prefix)
        return url

    @property
    def effective_trials_backend(self) -> TrialsBackend:
        if self.trials_backend is not None:
            return self.trials_backend
        return "ray" if self.ray_address else "none"
