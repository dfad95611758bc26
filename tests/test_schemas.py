"""The checked-in JSON Schemas are current, are valid JSON Schema, and describe real documents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from stratagem.builders import PartitionedPS
from stratagem.ir import ModelGraph, ResourceSpec
from stratagem.ir.schemas import DOCUMENTS, render
from stratagem.layout import Layout

SCHEMAS = Path(__file__).resolve().parent.parent / "docs" / "schemas"


def validator_for(name: str) -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_checked_in_schema_matches_the_code(name: str) -> None:
    path = SCHEMAS / f"{name}.schema.json"
    assert path.exists(), f"{path} is missing; run `make schemas`"
    assert path.read_text() == render(name), f"{path} is stale; run `make schemas` and commit the result"


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_checked_in_schema_is_valid_json_schema(name: str) -> None:
    validator = validator_for(name)
    assert validator.schema["additionalProperties"] is False


def real_documents(graph: ModelGraph, resources: ResourceSpec) -> dict[str, dict[str, Any]]:
    strategy = PartitionedPS().build(graph, resources)
    return {
        "model_graph": graph.model_dump(mode="json"),
        "resource_spec": resources.model_dump(mode="json"),
        "strategy": strategy.model_dump(mode="json"),
        "layout": Layout.from_string(
            "tp=2,pp=2,mb=1,gbs=64,zero=1,recompute=selective,precision=amp-bf16,sp"
        ).model_dump(mode="json"),
    }


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_schema_accepts_a_real_document(name: str, embedding_graph: ModelGraph, t4_2x4: ResourceSpec) -> None:
    document = real_documents(embedding_graph, t4_2x4)[name]
    validator_for(name).validate(document)
    assert DOCUMENTS[name].parse(document).id == document["id"]


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_schema_rejects_an_unknown_field_like_the_code_does(
    name: str, mlp_graph: ModelGraph, cpu_1x2: ResourceSpec
) -> None:
    document = real_documents(mlp_graph, cpu_1x2)[name]
    document["surprise"] = 1
    errors = list(validator_for(name).iter_errors(document))
    assert any("surprise" in error.message for error in errors)
