"""A graph upload: the ModelGraph alone, or `{"graph": <ModelGraph>, "trace": "<base64 gzip JSON>"}`
with the operator trace capture recorded beside it.

Parsed in the ingestor (off the event loop, like every document body); every refusal is a
`BodyRejected` problem naming the field and the reason. A graph may name a trace (`trace_id`) that is
not uploaded: its trials then replay the per-layer totals.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from optimizer_service.core.errors import path_parts, validation_problems
from stratagem.errors import InvalidDocumentError
from stratagem.ir import ModelGraph
from stratagem.tracing.optrace import OperatorTrace, trace_graph_problems

MAX_TRACE_BYTES = 12 << 20
"""Compressed size of an uploaded trace: a 7B decoder's is well under 1 MiB (`benchmarks/trials.py`)."""
MAX_TRACE_JSON_BYTES = 256 << 20
"""What a trace may inflate to; a larger one is refused before it is parsed."""
MAX_TRACE_TEXT = (MAX_TRACE_BYTES + 2) // 3 * 4


@dataclass(frozen=True)
class GraphUpload:
    graph: ModelGraph
    trace: OperatorTrace | None


class UploadRejected(Exception):
    """`problems` are `{loc, msg}` pairs, `loc` starting at `body` (the ingestor's `BodyRejected` form)."""

    def __init__(self, problems: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(str(p["msg"]) for p in problems))
        self.problems = problems


def parse_upload(data: Any) -> GraphUpload:
    """The graph and, when one came with it, its trace."""
    if not isinstance(data, dict):
        raise _refused(
            ["body"], f"the body must be a JSON object (a ModelGraph, or {{graph, trace}}), got {type(data).__name__}"
        )
    if "graph" not in data or "layers" in data:
        return GraphUpload(_graph(data, ["body"]), None)
    unknown = sorted(set(data) - {"graph", "trace"})
    if unknown:
        raise _refused(["body", unknown[0]], f"unknown field {unknown[0]!r}; a graph upload has 'graph' and 'trace'")
    graph = _graph(data["graph"], ["body", "graph"])
    if data.get("trace") is None:
        return GraphUpload(graph, None)
    trace = _trace(data["trace"])
    problems = trace_graph_problems(trace, graph)
    if problems:
        raise UploadRejected([{"loc": ["body", *path_parts(p.path)], "msg": p.reason} for p in problems])
    return GraphUpload(graph, trace)


def _refused(loc: list[str | int], message: str) -> UploadRejected:
    return UploadRejected([{"loc": loc, "msg": message}])


def _graph(data: Any, loc: list[str | int]) -> ModelGraph:
    if not isinstance(data, dict):
        raise _refused(loc, f"a ModelGraph is a JSON object, got {type(data).__name__}")
    try:
        return ModelGraph.model_validate(data)
    except ValidationError as error:
        items = [{**item, "loc": (*loc, *item["loc"])} for item in error.errors(include_url=False)]
        raise UploadRejected(validation_problems(items, None)) from None


def _trace(text: Any) -> OperatorTrace:
    loc: list[str | int] = ["body", "trace"]
    if not isinstance(text, str):
        raise _refused(loc, "must be base64 text of the gzip-compressed trace JSON")
    if len(text) > MAX_TRACE_TEXT:
        raise _refused(loc, f"the trace is {len(text) * 3 // 4} bytes compressed; the limit is {MAX_TRACE_BYTES}")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as error:
        raise _refused(loc, f"not base64 ({error})") from None
    try:
        return OperatorTrace.from_bytes(data, max_json_bytes=MAX_TRACE_JSON_BYTES)
    except InvalidDocumentError as error:
        raise UploadRejected([{"loc": [*loc, *path_parts(p.path)], "msg": p.reason} for p in error.problems]) from None
