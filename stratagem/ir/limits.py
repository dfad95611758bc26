"""Bounds on every document: sizes, counts, nesting depth and magnitudes.

A document may come from anyone who can reach the service, so each number it holds is bounded where
it is parsed: far above any real model or cluster (a 1,000-billion-parameter model, a 100,000-GPU
cluster), far below what makes arithmetic overflow or a worker allocate without end. A value past its
bound is refused like any other invalid field, with its path and the bound in words.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, Field

MAX_NAME_CHARS = 1024
"""Names (layers, variables, devices, documents, builders)."""
MAX_TEXT_CHARS = 100_000
"""Free text (notes, error messages)."""
MAX_YAML_CHARS = 1_000_000
"""An AutoDist resource_spec.yml sent as text."""

MAX_LAYERS = 1_000_000
MAX_VARIABLES = 1_000_000
MAX_REFERENCES = 100_000
"""Inputs or variables one layer lists."""
MAX_RANK = 16
"""Axes of one variable."""
MAX_DIM = 1 << 40
"""One axis of a variable."""
MAX_NUMEL = 1 << 44
"""Elements of one variable (17.6 trillion: a whole 1T-parameter model in one tensor, and then some)."""
MAX_PARAMETERS = 1 << 50
"""Elements of all of a graph's variables together."""
MAX_BATCH_SIZE = 1 << 24
MAX_LOOKUPS = 1 << 44
MAX_FLOPS = 1e24
"""Operations of one layer's forward or backward pass at the graph's batch size."""
MAX_BYTES = 1e18
"""Bytes of one layer's traffic or activations."""

MAX_NODES = 100_000
MAX_DEVICES_PER_NODE = 4096
MAX_DEVICE_INDEX = 1 << 20
MAX_BANDWIDTH_GBPS = 1e7
MAX_LATENCY_US = 1e9
MAX_DEVICE_KINDS = 256

MAX_REPLICAS = 1 << 20
MAX_DEGREE = 1 << 20
"""Any parallel degree, shard count, micro-batch count or staleness bound."""
MAX_NOTES = 1000

MAX_JSON_DEPTH = 32
"""Nesting of free-form JSON (provenance, AutoDist's ssh section, a search's summary)."""
MAX_JSON_ITEMS = 100_000
"""Values in one free-form JSON object, counted at every depth."""

Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
OptionalName = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]


def at_most(bound: float) -> AfterValidator:
    """An upper bound that lets inf and nan through to the document's own check, which names them as such."""

    def check(value: float) -> float:
        if value > bound and math.isfinite(value):
            raise ValueError(f"{value:.3g} is more than the bound {bound:.3g}")
        return value

    return AfterValidator(check)


Flops = Annotated[float, Field(ge=0), at_most(MAX_FLOPS)]
Bytes = Annotated[float, Field(ge=0), at_most(MAX_BYTES)]
Degree = Annotated[int, Field(ge=1, le=MAX_DEGREE)]


def json_problem(value: Any, *, max_depth: int = MAX_JSON_DEPTH, max_items: int = MAX_JSON_ITEMS) -> str | None:
    """Why a free-form JSON value is too deep or too large, with the path of the first offender; None if bounded.

    Iterative, so a value nested far deeper than the bound is measured without recursion."""
    pending: list[tuple[Any, str, int]] = [(value, "", 0)]
    items = 0
    while pending:
        current, path, depth = pending.pop()
        if isinstance(current, dict):
            children = [(v, f"{path}.{k}" if path else str(k), depth + 1) for k, v in current.items()]
        elif isinstance(current, (list, tuple)):
            children = [(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(current)]
        else:
            if isinstance(current, str) and len(current) > MAX_TEXT_CHARS:
                return f"{path or 'value'}: a string of {len(current)} characters; at most {MAX_TEXT_CHARS}"
            continue
        if depth >= max_depth:
            return f"{path or 'value'}: nested deeper than {max_depth} levels"
        items += len(children)
        if items > max_items:
            return f"more than {max_items} values in all"
        pending.extend(children)
    return None


def _bounded_json(value: Any) -> Any:
    problem = json_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


BoundedJSON = Annotated[dict[str, Any], AfterValidator(_bounded_json)]
"""A free-form JSON object (provenance and the like) within MAX_JSON_DEPTH and MAX_JSON_ITEMS."""
