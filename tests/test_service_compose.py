"""docker-compose.yml follows the Compose Specification and wires the deployment as docs/deploy.md says.

The specification check uses the `compose-spec` package (offline): its Rust parser implements the
Compose Specification strictly (unknown keys and wrong types are errors), `validate()` checks that
every referenced network, volume, config and secret is defined, and its pydantic models are generated
from the specification's JSON schema.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

compose_spec = pytest.importorskip(
    "compose_spec", reason="compose-spec (a dev dependency) ships the Compose Specification"
)

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text()))


def test_the_compose_file_is_valid_against_the_compose_specification() -> None:
    from compose_spec.models import ComposeSpecification

    text = COMPOSE.read_text()
    parsed = compose_spec.PyCompose.from_yaml(text)
    parsed.validate()
    ComposeSpecification.model_validate(yaml.safe_load(text))
    assert set(parsed.service_names()) == {"postgres", "service", "ray-head", "ray-gpu-worker"}


def test_the_validator_would_catch_a_mistake() -> None:
    broken = COMPOSE.read_text().replace("    shm_size: 2gb\n", "    shm_size: 2gb\n    shmsize: 2gb\n", 1)
    with pytest.raises(ValueError, match="shmsize"):
        compose_spec.PyCompose.from_yaml(broken)


def test_postgres_keeps_its_data_and_reports_health(compose: dict[str, Any]) -> None:
    postgres = compose["services"]["postgres"]
    assert any(volume.endswith(":/var/lib/postgresql/data") for volume in postgres["volumes"])
    assert "pgdata" in compose["volumes"]
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])


def test_the_service_waits_for_a_healthy_database_and_checks_its_own_health(compose: dict[str, Any]) -> None:
    service = compose["services"]["service"]
    assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert service["environment"]["DATABASE_URL"].startswith("postgresql://")
    assert service["environment"]["RAY_ADDRESS"].startswith("ray://ray-head:")
    assert "/healthz" in " ".join(service["healthcheck"]["test"])


def test_gpu_workers_reserve_nvidia_gpus_and_join_the_ray_head(compose: dict[str, Any]) -> None:
    worker = compose["services"]["ray-gpu-worker"]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert "--address=ray-head:6379" in worker["command"]
    assert "--head" in compose["services"]["ray-head"]["command"]


def test_the_dockerfile_builds_every_package_the_service_imports() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert dockerfile.startswith("#") and "FROM python:3.11-slim" in dockerfile
    for package in ("stratagem", "simulator", "optimizer_service", "trial_runner", "models", "migrations"):
        assert f"COPY {package} ./{package}" in dockerfile
    assert "/healthz" in dockerfile
