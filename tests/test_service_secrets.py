"""Secrets are masked in every message and log: database passwords, API keys, bearer tokens."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from optimizer_service.app import create_app
from optimizer_service.core.redact import mask_secrets, public_text
from optimizer_service.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "hunter2-secret"


@pytest.mark.slow
@pytest.mark.parametrize(
    "url", [f"mysql://admin:{PASSWORD}@db.internal/prod", f"postgresql://admin:{PASSWORD}@127.0.0.1:1/prod"]
)
def test_stratagem_db_never_prints_the_database_password(url: str) -> None:
    """An unsupported driver and an unreachable server both fail with a one-line error, password masked."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "stratagem", "db", "current", "--database-url", url],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode != 0
    assert PASSWORD not in done.stdout + done.stderr
    assert "admin:***@" in done.stderr, done.stderr


def test_every_log_record_of_the_service_masks_secrets(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    create_app(Settings(database_url=f"sqlite:///{tmp_path / 'db'}", workers=0))
    with caplog.at_level(logging.INFO):
        logging.getLogger("anything.at.all").warning(
            "connecting to %s with Authorization: Bearer %s", f"postgresql://u:{PASSWORD}@h/db", PASSWORD
        )
    assert PASSWORD not in caplog.text
    assert "postgresql://u:***@h/db" in caplog.text and "Bearer ***" in caplog.text


def test_text_for_clients_names_files_and_masks_secrets() -> None:
    text = 'File "/srv/stratagem/trial_runner/worker.py", line 9: password=hunter2 at postgres://a:b@c/d'
    assert public_text(text) == 'File "worker.py", line 9: password=*** at postgres://a:***@c/d'
    assert mask_secrets("api_key: abc123 token=xyz") == "api_key: *** token=***"
