"""Request bodies that carry documents are parsed, validated and stored off the event loop.

Validating a large document is CPU work that holds the interpreter lock for long stretches (pydantic's
core does not release it), so a thread is not enough: while a 15 MB graph is validated, a thread
beside the event loop would still stall every other request. Bodies up to `INLINE_BYTES` are handled
in a worker thread (a few milliseconds of work); larger ones in a separate parser process, which
validates the body, does the submission's database work itself and hands back a small JSON-able
summary, so the service's own interpreter never touches the large document.

`perform` is the one function both paths run: parse the JSON (with the service's words for a body
that is not JSON), validate it into the core's input model, act (store a document, submit a job,
record a trial, price layouts) and summarize. Failures come back as values, not exceptions, so they cross the
process boundary as plain data and are raised again on the service's side.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Literal

import anyio
from pydantic import BaseModel, ValidationError
from sqlalchemy.orm import Session, sessionmaker

from optimizer_service.core import jobs as core_jobs
from optimizer_service.core import predict as core_predict
from optimizer_service.core import trials as core_trials
from optimizer_service.core.documents import store_graph, store_resources, store_trace
from optimizer_service.core.errors import path_parts, validation_problems
from optimizer_service.core.graph_upload import UploadRejected, parse_upload
from optimizer_service.core.inputs import OptimizeInput, PredictInput, TrialInput
from optimizer_service.settings import Settings
from stratagem import errors as stratagem_errors
from stratagem.errors import InvalidDocumentError, ServiceError
from stratagem.ir import ModelGraph, ResourceSpec

log = logging.getLogger(__name__)

INLINE_BYTES = 256 * 1024
"""Bodies up to this size are handled in a thread; larger ones in the parser process."""

Kind = Literal["graph", "resources", "optimize", "trial", "predict"]
MODELS: dict[str, type[BaseModel]] = {
    "graph": ModelGraph,
    "resources": ResourceSpec,
    "optimize": OptimizeInput,
    "trial": TrialInput,
    "predict": PredictInput,
}


class BodyRejected(Exception):
    """The body is not a valid request: `problems` are `{loc, msg}` pairs, `loc` starting at `body`."""

    def __init__(self, problems: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, p['loc']))}: {p['msg']}" for p in problems))
        self.problems = problems


def perform(
    kind: Kind, body: bytes, content_type: str | None, factory: sessionmaker[Session], settings: Settings
) -> dict[str, Any]:
    """Parse, validate and act on one request body; the answer as plain data (see `Ingestor.run`)."""
    try:
        request = validate(kind, body, content_type)
        with factory() as session:
            return {"ok": _act(kind, request, session, settings)}
    except BodyRejected as rejected:
        return {"problems": rejected.problems}
    except ServiceError as error:
        return {"service_error": [type(error).__name__, str(error), error.status, error.detail]}
    except InvalidDocumentError as error:
        return {"problems": [{"loc": ["body", *path_parts(p.path)], "msg": p.reason} for p in error.problems]}


def validate(kind: Kind, body: bytes, content_type: str | None) -> Any:
    data = parse_json(body, content_type)
    if kind == "graph":
        try:
            return parse_upload(data)
        except UploadRejected as rejected:
            raise BodyRejected(rejected.problems) from None
    try:
        return MODELS[kind].model_validate(data)
    except ValidationError as error:
        problems = validation_problems(
            [{**item, "loc": ("body", *item["loc"])} for item in error.errors(include_url=False)], None
        )
        raise BodyRejected(problems) from None


def parse_json(body: bytes, content_type: str | None) -> Any:
    """The body as JSON, or the reason it is not, in the words a client can act on."""
    if content_type and not _is_json(content_type):
        raise BodyRejected(
            [{"loc": ["body"], "msg": "the body was not read as JSON: send it with 'Content-Type: application/json'"}]
        )
    if not body.strip():
        raise BodyRejected([{"loc": ["body"], "msg": "the body is empty; expected a JSON object"}])
    try:
        data = json.loads(body)
    except json.JSONDecodeError as error:
        where = f"line {error.lineno} column {error.colno} (char {error.pos})"
        raise BodyRejected(
            [{"loc": ["body"], "msg": f"the body is not valid JSON: {error.msg.removesuffix(' at')} at {where}"}]
        ) from None
    except (RecursionError, UnicodeDecodeError, ValueError) as error:
        reason = "it nests too deeply" if isinstance(error, RecursionError) else str(error)
        raise BodyRejected([{"loc": ["body"], "msg": f"the body is not valid JSON: {reason}"}]) from None
    return data


def _is_json(content_type: str) -> bool:
    subtype = content_type.split(";")[0].strip().lower()
    return subtype == "application/json" or subtype.endswith("+json")


def _act(kind: Kind, request: Any, session: Session, settings: Settings) -> dict[str, Any]:
    if kind == "graph":
        graph_row, created = store_graph(session, request.graph)
        if request.trace is not None:
            store_trace(session, request.trace, request.trace.to_bytes())
        session.commit()
        return {**_row(graph_row, created), **graph_counts(request.graph)}
    if kind == "resources":
        resource_row, created = store_resources(session, request)
        session.commit()
        return {**_row(resource_row, created), "num_nodes": len(request.nodes), "num_devices": request.num_devices}
    if kind == "optimize":
        job = core_jobs.submit_job(session, request, settings)
        return {"id": str(job.id), "status": job.status.value}
    if kind == "predict":
        return core_predict.predictions(session, request)
    trial = core_trials.record_trial(session, request)
    return {"id": str(trial.id)}


def _row(row: Any, created: bool) -> dict[str, Any]:
    return {"id": row.id, "name": row.name, "created_at": row.created_at.isoformat(), "created": created}


def graph_counts(graph: ModelGraph) -> dict[str, Any]:
    return {
        "batch_size": graph.batch_size,
        "num_layers": len(graph.layers),
        "num_variables": len(graph.variables),
        "num_parameters": graph.num_parameters,
        "total_flops": graph.total_flops,
    }


# --- the parser process ------------------------------------------------------------------------

_process_factories: dict[str, sessionmaker[Session]] = {}


def _process_start() -> None:
    from trial_runner.lifeline import die_with_parent

    die_with_parent(os.getppid())


def _in_process(kind: Kind, body: bytes, content_type: str | None, settings_json: str) -> dict[str, Any]:
    from optimizer_service.db import make_engine, make_session_factory

    settings = Settings.model_validate_json(settings_json)
    factory = _process_factories.get(settings.database_url)
    if factory is None:
        factory = _process_factories[settings.database_url] = make_session_factory(make_engine(settings.database_url))
    try:
        return perform(kind, body, content_type, factory, settings)
    except Exception as error:  # the service's side logs it with the request id
        return {"internal": f"{type(error).__name__}: {error}"}


class Ingestor:
    """Runs `perform` for one app: in a thread for small bodies, in the parser process for large ones."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._settings_json = settings.model_dump_json(exclude={"api_key"})
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self.in_memory = settings.database_url in ("sqlite://", "sqlite:///:memory:")
        """An in-memory SQLite exists in this process alone: every body is handled here."""

    async def run(
        self, kind: Kind, body: bytes, content_type: str | None, factory: sessionmaker[Session]
    ) -> dict[str, Any]:
        """The `ok` summary; raises the client's error (422, 404, 429, ...) as the core would."""
        if len(body) <= INLINE_BYTES or self.in_memory:
            answer = await anyio.to_thread.run_sync(perform, kind, body, content_type, factory, self._settings)
        else:
            future = self._process().submit(_in_process, kind, body, content_type, self._settings_json)
            answer = await asyncio.wrap_future(future)
        return _unpack(answer)

    def _process(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                context = multiprocessing.get_context("spawn")
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_process_start)
            return self._pool

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None


def _unpack(answer: dict[str, Any]) -> dict[str, Any]:
    if "ok" in answer:
        return dict(answer["ok"])
    if "problems" in answer:
        raise BodyRejected(list(answer["problems"]))
    if "service_error" in answer:
        name, message, status, detail = answer["service_error"]
        kind = getattr(stratagem_errors, name, ServiceError)
        raise kind(message, status=status, detail=detail)
    raise RuntimeError(f"the parser process failed: {answer.get('internal', answer)}")
