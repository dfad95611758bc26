"""Property-based fuzzing of the whole API from its own OpenAPI schema: no input makes it answer 5xx.

schemathesis generates valid and invalid requests for every operation and calls the app in-process
(ASGI; schemathesis runs the app's lifespan, so the database and migrations are real). A bounded
number of examples per operation keeps the run to about a minute.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")

from schemathesis.checks import not_a_server_error  # noqa: E402
from service_helpers import MeanRatioTrainer  # noqa: E402

from optimizer_service.app import create_app  # noqa: E402
from optimizer_service.settings import Settings  # noqa: E402

MAX_EXAMPLES = int(os.environ.get("STRATAGEM_FUZZ_EXAMPLES", "8"))
DATABASE = (
    os.environ.get("STRATAGEM_FUZZ_DATABASE_URL")
    or f"sqlite:///{Path(tempfile.mkdtemp(prefix='stratagem-fuzz-')) / 'stratagem.db'}"
)
"""A fresh SQLite file by default; point it at an empty PostgreSQL database to fuzz that backend."""

# No workers: submitted jobs stay queued, so fuzzing exercises the API, not the search. A trainer is
# plugged in because retraining without one is a deliberate 503.
settings = Settings(database_url=DATABASE, workers=0, max_queue_length=1_000_000)
app = create_app(settings, cost_model_trainer=MeanRatioTrainer())
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.mark.slow
@schema.parametrize()
@hypothesis.settings(
    max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(hypothesis.HealthCheck)
)
def test_no_request_makes_the_service_answer_5xx(case: object) -> None:
    case.call_and_validate(checks=[not_a_server_error])  # type: ignore[attr-defined]
