"""Settings come from the environment: `STRATAGEM_*`, plus the plain `DATABASE_URL` and `RAY_ADDRESS`."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from optimizer_service.settings import Settings


def test_defaults_need_nothing_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DATABASE_URL", "RAY_ADDRESS", "STRATAGEM_DATABASE_URL", "STRATAGEM_RAY_ADDRESS", "STRATAGEM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings()
    assert settings.database_url == "sqlite:///./stratagem.db"
    assert settings.effective_trials_backend == "none"
    assert (settings.max_trials, settings.api_key, settings.read_requires_key) == (4, None, False)


def test_plain_database_url_and_ray_address_are_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://svc@db:5432/stratagem")
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    settings = Settings()
    assert settings.database_url == "postgresql+psycopg://svc@db:5432/stratagem"
    assert settings.ray_address == "ray://head:10001"
    assert settings.effective_trials_backend == "ray"


def test_prefixed_variables_win_and_configure_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "sqlite:///plain.db")
    monkeypatch.setenv("STRATAGEM_DATABASE_URL", "sqlite:///prefixed.db")
    monkeypatch.setenv("STRATAGEM_API_KEY", "k")
    monkeypatch.setenv("STRATAGEM_WORKERS", "3")
    monkeypatch.setenv("STRATAGEM_TRIALS_BACKEND", "local")
    settings = Settings()
    assert settings.database_url == "sqlite:///prefixed.db"
    assert settings.api_key is not None and settings.api_key.get_secret_value() == "k"
    assert (settings.workers, settings.effective_trials_backend) == (3, "local")


def test_a_bad_value_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATAGEM_MAX_QUEUE_LENGTH", "0")
    with pytest.raises(ValidationError) as error:
        Settings()
    assert "max_queue_length" in str(error.value)


@pytest.mark.parametrize("blank", ["", "  "])
def test_a_blank_api_key_means_no_key(monkeypatch: pytest.MonkeyPatch, blank: str) -> None:
    # docker-compose.yml sets STRATAGEM_API_KEY to "" when the operator picked none
    monkeypatch.setenv("STRATAGEM_API_KEY", blank)
    assert Settings().api_key is None
