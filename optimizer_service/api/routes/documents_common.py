"""Helpers shared by the document routers (graphs, resource specs): ids, paging, summaries."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from fastapi import Query

from optimizer_service.core.errors import not_found

CONTENT_ID = re.compile(r"^[0-9a-f]{64}$")

Limit = Annotated[int, Query(ge=1, le=500, description="Page size")]
Offset = Annotated[int, Query(ge=0, le=1_000_000_000, description="Rows to skip")]


def checked_id(what: str, ident: str) -> str:
    """A content id is 64 hex digits; anything else cannot name a stored document."""
    if not CONTENT_ID.match(ident):
        raise not_found(what, ident)
    return ident


def graph_summary(document: dict[str, Any]) -> dict[str, Any]:
    """Counts read straight from the stored JSON, so listing graphs never re-validates them."""
    variables = document.get("variables", [])
    layers = document.get("layers", [])
    flops = sum(float(layer.get("fwd_flops", 0.0)) + float(layer.get("bwd_flops", 0.0)) for layer in layers)
    return {
        "batch_size": int(document.get("batch_size", 0)),
        "num_layers": len(layers),
        "num_variables": len(variables),
        "num_parameters": sum(math.prod(v.get("shape", [])) for v in variables),
        "total_flops": flops if math.isfinite(flops) else 0.0,
    }


def resources_summary(document: dict[str, Any]) -> dict[str, Any]:
    nodes = document.get("nodes", [])
    devices = sum(len(node.get("gpus") or []) or len(node.get("cpus") or []) for node in nodes)
    return {"num_nodes": len(nodes), "num_devices": devices}
