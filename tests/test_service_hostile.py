"""Hostile requests are refused at the edge with a 422 naming the field, and nothing is stored.

Each body below once reached the workers (a 500, or a 202 and then an internal error); the bounds on
every document (`stratagem.ir.limits`) now refuse them where they are parsed, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sample_documents import make_mlp_graph, make_t4_cluster


def _graph(**changes: Any) -> dict[str, Any]:
    data = make_mlp_graph().model_dump(mode="json", exclude={"id"})
    data.update(changes)
    return data


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def _with_variable_shape(shape: list[int]) -> dict[str, Any]:
    data = _graph()
    data["variables"][0]["shape"] = shape
    return data


def _with_layer(**fields: Any) -> dict[str, Any]:
    data = _graph()
    data["layers"][0].update(fields)
    return data


def _cluster(**node: Any) -> dict[str, Any]:
    data = make_t4_cluster(1).model_dump(mode="json", exclude={"id"})
    data["nodes"][0].update(node)
    return data


HOSTILE: dict[str, tuple[Callable[[], dict[str, Any]], list[Any], str]] = {
    "provenance nested 300 deep": (
        lambda: {"graph": _graph(provenance=_nested(300))},
        ["body", "graph", "provenance"],
        "nested deeper than 32 levels",
    ),
    "a 400-digit batch size": (lambda: {"graph": _graph(batch_size=10**400)}, ["body", "graph", "batch_size"], ""),
    "a variable shaped [10^30, 10^30]": (
        lambda: {"graph": _with_variable_shape([10**30, 10**30])},
        ["body", "graph", "variables", 0, "shape", 0],
        "",
    ),
    "a variable of 2^60 elements": (
        lambda: {"graph": _with_variable_shape([1 << 30, 1 << 30])},
        ["body", "graph", "variables", 0],
        "shape: 1.15e+18 elements",
    ),
    "a graph with no layers": (lambda: {"graph": _graph(layers=[])}, ["body", "graph", "layers"], ""),
    "10^30 FLOPs in one layer": (
        lambda: {"graph": _with_layer(fwd_flops=1e30)},
        ["body", "graph", "layers", 0, "fwd_flops"],
        "more than the bound",
    ),
    "a layer name of a megabyte": (
        lambda: {"graph": _with_layer(name="x" * 1_000_000)},
        ["body", "graph", "layers", 0, "name"],
        "",
    ),
    "5000 GPUs in one node": (
        lambda: {"resources": _cluster(gpus=list(range(5000)))},
        ["body", "resources", "nodes", 0, "gpus"],
        "",
    ),
    "an ssh section nested 100 deep": (
        lambda: {"resources": {**_cluster(), "ssh": _nested(100)}},
        ["body", "resources", "ssh"],
        "nested deeper",
    ),
}


def _body(part: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "graph": make_mlp_graph().model_dump(mode="json"),
        "resources": make_t4_cluster(1).model_dump(mode="json"),
        "max_trials": 0,
    }
    return body | part


def _assert_nothing_stored(client: TestClient) -> None:
    for listing in ("/v1/graphs", "/v1/resources", "/v1/jobs", "/v1/trials"):
        assert client.get(listing).json()["count"] == 0, listing


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_document_is_a_422_naming_the_field_and_stores_nothing(make_client, case: str) -> None:
    client: TestClient = make_client(workers=0)
    part, loc, words = HOSTILE[case]
    response = client.post("/v1/optimize", json=_body(part()))
    assert response.status_code == 422, response.text[:500]
    problems = response.json()["detail"]
    assert any(p["loc"][: len(loc)] == loc and words in p["msg"] for p in problems), problems
    assert len(response.text) < 20_000, "the refusal echoes the hostile body back"
    _assert_nothing_stored(client)


def test_a_hostile_graph_upload_is_refused_the_same_way(make_client) -> None:
    client: TestClient = make_client(workers=0)
    response = client.post("/v1/graphs", json=_graph(provenance=_nested(300)))
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"][:2] == ["body", "provenance"]
    _assert_nothing_stored(client)


def test_a_resources_string_naming_a_server_file_is_yaml_text_never_a_path(make_client, tmp_path: Path) -> None:
    """The file holds a valid AutoDist spec with secrets; the request gets a 422 and the file is never opened."""
    secret = tmp_path / "cluster.yml"
    secret.write_text(
        "nodes:\n  - address: 10.0.0.1\n    gpus: [0]\n    chief: true\nssh:\n  key_file: /root/.ssh/id_rsa\n"
    )
    opened: list[str] = []
    watching = [True]

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if watching[0] and event == "open" and args and str(args[0]) == str(secret):
            opened.append(str(args[0]))

    sys.addaudithook(audit)
    try:
        client: TestClient = make_client(workers=0)
        response = client.post("/v1/optimize", json=_body({"resources": str(secret)}))
    finally:
        watching[0] = False
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][:2] == ["body", "resources"]
    assert "key_file" not in response.text and "ssh" not in response.text
    assert opened == []
    _assert_nothing_stored(client)
