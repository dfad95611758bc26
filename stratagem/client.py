"""The client SDK: talk to a Stratagem service from Python.

    with stratagem.Client("http://optimizer:8000") as client:
        job = client.optimize(graph, resources, max_trials=4)
        best = job.wait().best()

Every error the service returns is raised as a typed `ServiceError` carrying the service's message,
so callers never parse HTTP themselves. The transport is swappable (httpx's `transport=`), which is how
the tests run the SDK against the real app in-process.
"""

from __future__ import annotations

import base64
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO
from urllib.parse import quote

import httpx

from stratagem.errors import (
    NotFoundError,
    RequestRejectedError,
    ServiceError,
    ServiceUnavailableError,
    StratagemError,
)
from stratagem.ir import ModelGraph, ResourceSpec, Strategy
from stratagem.layout import Layout

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
DETAIL_CHARS = 300
"""How much of an error answer that is not the service's own (an HTML page) a message quotes."""


def _raise_for_response(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        body = response.json()
    except ValueError:
        body = response.text
    detail = body.get("detail", body) if isinstance(body, dict) else body
    words = " ".join(_words(detail).split())
    if len(words) > DETAIL_CHARS:
        words = words[:DETAIL_CHARS] + "..."
    message = f"{response.request.method} {response.request.url.path} -> {response.status_code}: {words}"
    if response.status_code == 404:
        raise NotFoundError(message, status=404, detail=detail)
    if response.status_code == 429 or response.status_code >= 500:
        raise ServiceUnavailableError(message, status=response.status_code, detail=detail)
    raise RequestRejectedError(message, status=response.status_code, detail=detail)


def _words(detail: Any) -> str:
    """The service's error detail as one readable line (FastAPI-style lists become `loc: msg; ...`)."""
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, dict):
                loc = ".".join(str(p) for p in item.get("loc", []))
                parts.append(f"{loc}: {item.get('msg', item)}" if loc else str(item.get("msg", item)))
            else:
                parts.append(str(item))
        return "; ".join(parts)
    return str(detail)


def _segment(name: str, value: Any) -> str:
    """An id as one URL path segment: quoted, so `a/b` or `../x` cannot reach another endpoint."""
    if not isinstance(value, str):
        raise RequestRejectedError(f"{name}: expected a string id, got {type(value).__name__}", detail=[name])
    if value.strip() in ("", ".", ".."):
        raise RequestRejectedError(f"{name}: expected an id, got {value!r}", detail=[name])
    return quote(value, safe="")


def _non_finite(value: Any, path: str) -> str | None:
    """Where the first NaN or infinity sits in a request body (JSON has neither), as a field path."""
    if isinstance(value, float) and not math.isfinite(value):
        return path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        found = _non_finite(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def _field(body: Any, key: str, where: str) -> Any:
    """`body[key]` of an answer that must be a JSON object; anything else is a ServiceError, not a KeyError."""
    if not isinstance(body, dict) or key not in body:
        raise ServiceError(f"{where}: the answer has no {key!r} field; is this a Stratagem service?", detail=body)
    return body[key]


def _object(body: Any, where: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ServiceError(
            f"{where}: expected a JSON object, got {type(body).__name__}; is this a Stratagem service?", detail=body
        )
    return body


@dataclass
class Job:
    """A handle on an optimization job; `refresh()` re-reads it, `wait()` blocks until it ends."""

    client: Client
    id: str
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return str(self.data.get("status", "unknown"))

    @property
    def done(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def refresh(self) -> Job:
        self.data = _object(self.client._get_json(f"/v1/jobs/{_segment('job_id', self.id)}"), "GET /v1/jobs/{id}")
        return self

    def wait(self, timeout: float | None = None, *, poll_s: float = 0.5, progress: TextIO | bool | None = None) -> Job:
        """Block until the job ends; raise ServiceError if it failed or was cancelled.

        `progress=True` (or a stream) draws a one-line progress bar, so a long search is visibly alive.
        """
        if timeout is not None and not timeout >= 0:
            raise StratagemError(f"wait(timeout=...): must be None or 0 or more seconds, got {timeout}")
        if not poll_s > 0:
            raise StratagemError(f"wait(poll_s=...): must be a positive number of seconds, got {poll_s}")
        stream = sys.stderr if progress is True else (progress or None)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.refresh().done:
            if stream:
                stream.write("\r" + render_progress(self.data))
                stream.flush()
            if deadline is not None and time.monotonic() > deadline:
                raise ServiceUnavailableError(f"job {self.id} still {self.status} after {timeout:.0f} s")
            time.sleep(poll_s)
        if stream:
            stream.write("\r" + render_progress(self.data) + "\n")
        if self.status != "succeeded":
            raise ServiceError(
                f"job {self.id} {self.status}: {self.data.get('error') or 'no error text'}", detail=self.data
            )
        return self

    def best(self) -> Strategy:
        return Strategy.parse(self.client._get_json(f"/v1/jobs/{_segment('job_id', self.id)}/best"))

    def strategies(self) -> list[dict[str, Any]]:
        """Ranked candidates, the answer first: each has the strategy, its prediction, when trialled its
        measurement (and its re-levelled prediction when the first trial missed far), and the near-copies
        it stands for (`variant_count`, `variants`). The user's `current` configuration is among them."""
        body = self.client._get_json(f"/v1/jobs/{_segment('job_id', self.id)}/strategies")
        return list(_field(body, "data", "GET /v1/jobs/{id}/strategies"))

    @property
    def result(self) -> dict[str, Any]:
        """The answer's summary once the job ended (`decision`, `speedup_vs_current`, notes, ...); {} before."""
        result = self.data.get("result")
        return dict(result) if isinstance(result, dict) else {}

    @property
    def decision(self) -> dict[str, Any] | None:
        """Which rule chose the answer, and why (`rule`, `reason`, `chosen`, `fastest`, `gain`, `bar`)."""
        decision = self.result.get("decision")
        return dict(decision) if isinstance(decision, dict) else None

    @property
    def speedup_vs_current(self) -> float | None:
        """The answer's predicted throughput over the `current` configuration's (None without one)."""
        value = self.result.get("speedup_vs_current")
        return float(value) if isinstance(value, (int, float)) else None

    def cancel(self) -> Job:
        body = self.client._post_json(f"/v1/jobs/{_segment('job_id', self.id)}/cancel", None)
        self.data = _object(body, "POST /v1/jobs/{id}/cancel")
        return self


def render_progress(job: dict[str, Any], width: int = 24) -> str:
    progress = job.get("progress") or {}
    budget = progress.get("trials_budget") or 0
    done = progress.get("trials_done") or 0
    fraction = 1.0 if job.get("status") in TERMINAL_STATUSES else (done / budget if budget else 0.0)
    bar = "#" * int(fraction * width)
    evaluated = progress.get("candidates_evaluated", 0)
    best = progress.get("best_step_time_s")
    best_text = f" best {best * 1e3:.1f} ms" if isinstance(best, (int, float)) else ""
    return f"[{bar:<{width}}] {job.get('status', '?'):9} {job.get('phase') or '':10} {evaluated} candidates, trials {done}/{budget}{best_text}"


class Client:
    """A connection to one Stratagem service; use as a context manager to close it."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {_checked_key(api_key)}"} if api_key else {}
        if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
            raise StratagemError(f"timeout: must be a positive number of seconds (or None), got {timeout!r}")
        base_url = _checked_url(url)
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout, transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # --- plumbing ------------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        if self._http.is_closed:
            raise StratagemError(
                f"{method} {path}: this Client is closed; open a new one (or use it inside its `with` block)"
            )
        where = _non_finite(kwargs.get("json"), "body")
        if where is not None:
            raise RequestRejectedError(
                f"{method} {path}: {where}: must be a finite number (JSON has no NaN or infinity)", detail=[where]
            )
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as error:
            raise ServiceUnavailableError(f"{method} {path}: timed out ({error})") from None
        except httpx.TransportError as error:
            raise ServiceUnavailableError(f"{method} {path}: cannot reach {self._http.base_url} ({error})") from None
        _raise_for_response(response)
        return response

    def _get_json(self, path: str, **params: Any) -> Any:
        clean = {k: v for k, v in params.items() if v is not None}
        return _json(self._request("GET", path, params=clean))

    def _post_json(self, path: str, body: Any, **params: Any) -> Any:
        clean = {k: v for k, v in params.items() if v is not None}
        return _json(self._request("POST", path, json=body, params=clean))

    # --- documents -----------------------------------------------------------------------------

    def upload_graph(self, graph: ModelGraph) -> str:
        """Store the graph; the operator trace held beside it (`graph.trace`, from capture) goes with it."""
        body: dict[str, Any] = _document("graph", graph, ModelGraph)
        if graph.trace is not None:
            body = {"graph": body, "trace": base64.b64encode(graph.trace.to_bytes()).decode("ascii")}
        return str(_field(self._post_json("/v1/graphs", body), "id", "POST /v1/graphs"))

    def graph_trace(self, graph_id: str) -> Any:
        """The operator trace stored beside a graph (a `stratagem.tracing.OperatorTrace`)."""
        from stratagem.tracing.optrace import OperatorTrace

        response = self._request("GET", f"/v1/graphs/{_segment('graph_id', graph_id)}/trace")
        return OperatorTrace.from_bytes(response.content)

    def upload_resources(self, resources: ResourceSpec) -> str:
        body = _document("resources", resources, ResourceSpec)
        return str(_field(self._post_json("/v1/resources", body), "id", "POST /v1/resources"))

    def graph(self, graph_id: str) -> ModelGraph:
        return ModelGraph.parse(self._get_json(f"/v1/graphs/{_segment('graph_id', graph_id)}"))

    def resources(self, resource_id: str) -> ResourceSpec:
        return ResourceSpec.parse(self._get_json(f"/v1/resources/{_segment('resource_id', resource_id)}"))

    def strategy(self, strategy_id: str) -> Strategy:
        return Strategy.parse(self._get_json(f"/v1/strategies/{_segment('strategy_id', strategy_id)}"))

    def strategy_autodist(self, strategy_id: str) -> str:
        path = f"/v1/strategies/{_segment('strategy_id', strategy_id)}"
        return self._request("GET", path, params={"format": "autodist"}).text

    # --- jobs ----------------------------------------------------------------------------------

    def optimize(
        self,
        graph: ModelGraph,
        resources: ResourceSpec | str,
        *,
        max_trials: int | None = 4,
        objective: str = "throughput",
        search: dict[str, Any] | None = None,
        device: str | None = None,
        current: Layout | Strategy | str | None = None,
    ) -> Job:
        """Submit a job. `resources` may be a ResourceSpec or AutoDist resource_spec.yml text, whose
        nodes' GPU kind `device` names (the service's default, T4, when None). `max_trials=None`
        takes the service's default budget. `current` is the configuration you run today (a Layout, its
        short form `"dp=8,tp=4,mb=1,gbs=512"`, or a Strategy): the job prices it beside the answer and
        states the answer's predicted speed-up over it (`Job.speedup_vs_current`). A graph that holds its
        operator trace (as `stratagem.capture` leaves it) is uploaded with it first, so the job's trials
        replay the model's own operators."""
        document = _document("graph", graph, ModelGraph)
        body: dict[str, Any] = {
            "resources": _resources_text(resources)
            if isinstance(resources, str)
            else _document("resources", resources, ResourceSpec),
            "max_trials": max_trials,
            "objective": objective,
        }
        if search:
            body["search"] = search
        if device is not None:
            body["device"] = device
        if current is not None:
            body["current"] = _current(current)
        if graph.trace is not None:
            body["graph_id"] = self.upload_graph(graph)
        else:
            body["graph"] = document
        created = _object(self._post_json("/v1/optimize", body), "POST /v1/optimize")
        return Job(self, str(_field(created, "id", "POST /v1/optimize")), created)

    def job(self, job_id: str) -> Job:
        _segment("job_id", job_id)
        return Job(self, job_id).refresh()

    def jobs(self, *, status: str | None = None, limit: int = 50, offset: int = 0) -> list[dict[str, Any]]:
        return list(
            _field(self._get_json("/v1/jobs", status=status, limit=limit, offset=offset), "data", "GET /v1/jobs")
        )

    # --- trials and the cost model -------------------------------------------------------------

    def record_trial(
        self,
        strategy: Strategy,
        *,
        graph_id: str,
        resource_id: str,
        step_times_s: list[float],
        outcome: str = "ok",
        job_id: str | None = None,
        peak_memory_bytes: float | None = None,
        error: str | None = None,
        **summary: Any,
    ) -> dict[str, Any]:
        """Report a run measured elsewhere (e.g. on your cluster) so the cost model learns from it.

        `summary` takes the trial's other recorded fields (`median_s`, `p90_s`, `samples_per_s`,
        `backend`, `predicted_step_time_s`, `simulator_version`); the service computes the
        summaries left out from the step times, and rejects unknown names with a 422.
        """
        body = {
            "graph_id": graph_id,
            "resource_id": resource_id,
            "strategy": _document("strategy", strategy, Strategy),
            "step_times_s": step_times_s,
            "outcome": outcome,
            "job_id": job_id,
            "peak_memory_bytes": peak_memory_bytes,
            "error": error,
            **{key: value for key, value in summary.items() if value is not None},
        }
        return dict(self._post_json("/v1/trials", body))

    def trials(
        self, *, job_id: str | None = None, graph_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[dict[str, Any]]:
        body = self._get_json("/v1/trials", job_id=job_id, graph_id=graph_id, limit=limit, offset=offset)
        return list(_field(body, "data", "GET /v1/trials"))

    def cost_model(self) -> dict[str, Any]:
        return dict(_object(self._get_json("/v1/cost-model"), "GET /v1/cost-model"))

    def health(self) -> dict[str, Any]:
        return dict(_object(self._get_json("/healthz"), "GET /healthz"))


def _json(response: httpx.Response) -> Any:
    """A success's JSON body; a page that is not JSON (another server on that port) is a ServiceError."""
    try:
        return response.json()
    except ValueError:
        kind = response.headers.get("content-type", "no content type")
        raise ServiceError(
            f"{response.request.method} {response.request.url.path} -> {response.status_code}: the answer is not JSON "
            f"({kind}); is {response.request.url.scheme}://{response.request.url.netloc.decode()} a Stratagem service?",
            status=response.status_code,
            detail=response.text[:DETAIL_CHARS],
        ) from None


def _document(name: str, value: Any, kind: type[ModelGraph] | type[ResourceSpec] | type[Strategy]) -> dict[str, Any]:
    """A document's JSON for a request body; any other type is named, not an AttributeError."""
    if not isinstance(value, kind):
        extra = " or AutoDist resource_spec.yml text" if kind is ResourceSpec else ""
        raise StratagemError(
            f"{name}: expected a stratagem.{kind.__name__}{extra}, got {type(value).__name__} "
            f"(a dict parses with stratagem.{kind.__name__}.parse)"
        )
    return dict(value.model_dump(mode="json"))


def _current(value: Any) -> str | dict[str, Any]:
    """A current configuration for a request body: a layout's short form as it is, a document as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, (Layout, Strategy)):
        return dict(value.model_dump(mode="json"))
    raise StratagemError(
        f"current: expected a stratagem.Layout, a Strategy or a layout's short form like 'dp=8,tp=4', "
        f"got {type(value).__name__}"
    )


def _resources_text(text: str) -> str:
    """AutoDist YAML text passes as it is; a file name does not: sent as YAML it would come back as a 422
    about a missing 'nodes' list, which hides that the file was never read."""
    name = text.strip()
    if "\n" not in name and name.endswith((".yml", ".yaml", ".json")):
        loader = "load" if name.endswith(".json") else "from_autodist_yaml"
        raise StratagemError(
            f"resources: {name!r} looks like a file name, but a string here is the text of an AutoDist "
            f"resource_spec.yml; pass stratagem.ResourceSpec.{loader}({name!r})"
        )
    return text


def _checked_url(url: Any) -> str:
    """The service's base URL: http(s) with a host, else a StratagemError naming `url`."""
    if not isinstance(url, str):
        raise StratagemError(f"url: expected a string like {DEFAULT_URL}, got {type(url).__name__}")
    try:
        parsed = httpx.URL(url.rstrip("/"))
    except (httpx.InvalidURL, ValueError, TypeError) as error:
        raise StratagemError(f"url {url!r}: not a URL ({error})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise StratagemError(f"url {url!r}: expected http:// or https:// and a host, like {DEFAULT_URL}")
    if parsed.port is not None and not 0 < parsed.port <= 65535:
        raise StratagemError(f"url {url!r}: port must be between 1 and 65535, got {parsed.port}")
    if parsed.path.rstrip("/").endswith("/v1"):
        root = str(parsed.copy_with(path=parsed.path.rstrip("/")[: -len("/v1")] or "/")).rstrip("/")
        raise StratagemError(f"url {url!r}: give the service's root ({root}); the client adds /v1 to every call")
    return str(parsed)


def _checked_key(api_key: Any) -> str:
    """An API key goes into a header: printable ASCII only."""
    if not isinstance(api_key, str):
        raise StratagemError(f"api_key: expected a string, got {type(api_key).__name__}")
    if not api_key.isascii() or not api_key.isprintable():
        raise StratagemError("api_key: must be printable ASCII (it is sent in the Authorization header)")
    return api_key


def optimize(
    model: Any,
    resources: ResourceSpec | str,
    *,
    example_inputs: tuple[Any, ...] | None = None,
    batch_size: int | None = None,
    optimizer: str = "adam",
    loss_fn: Callable[[Any], Any] | None = None,
    url: str = DEFAULT_URL,
    api_key: str | None = None,
    max_trials: int = 4,
    search: dict[str, Any] | None = None,
    device: str | None = None,
    timeout: float | None = 600.0,
    progress: TextIO | bool = True,
) -> Strategy:
    """The one-liner: capture the model, optimize it on the service, return the best strategy.

    `model` is a torch module (captured with `example_inputs` at `batch_size`, trained with the
    `optimizer` kind, scored by `loss_fn(output)` as `stratagem.capture` does: a model that returns
    logits rather than its loss needs it to record the real loss) or a ModelGraph.
    """
    graph = model if isinstance(model, ModelGraph) else _capture(model, example_inputs, batch_size, optimizer, loss_fn)
    with Client(url, api_key=api_key) as client:
        job = client.optimize(graph, resources, max_trials=max_trials, search=search, device=device)
        return job.wait(timeout, progress=progress).best()


def _capture(
    model: Any,
    example_inputs: tuple[Any, ...] | None,
    batch_size: int | None,
    optimizer: str,
    loss_fn: Callable[[Any], Any] | None,
) -> ModelGraph:
    from stratagem.tracing import capture

    if example_inputs is None or batch_size is None:
        raise StratagemError("optimize(model, ...): a torch module needs example_inputs and batch_size to be captured")
    return capture(model, example_inputs, batch_size=batch_size, optimizer=optimizer, loss_fn=loss_fn)
