"""The client SDK: talk to a Stratagem service from Python.

    with stratagem.Client("http://optimizer:8000") as client:
        job = client.optimize(graph, resources, max_trials=4)
        best = job.wait().best()

Every error the service returns is raised as a typed `ServiceError` carrying the service's message,
so callers never parse HTTP themselves. The transport is swappable (httpx's `transport=`), which is how
the tests run the SDK against the real app in-process.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx

from stratagem.errors import (
    NotFoundError,
    RequestRejectedError,
    ServiceError,
    ServiceUnavailableError,
    StratagemError,
)
from stratagem.ir import ModelGraph, ResourceSpec, Strategy

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


def _raise_for_response(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        body = response.json()
    except ValueError:
        body = response.text
    detail = body.get("detail", body) if isinstance(body, dict) else body
    message = f"{response.request.method} {response.request.url.path} -> {response.status_code}: {_words(detail)}"
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
        self.data = self.client._get_json(f"/v1/jobs/{self.id}")
        return self

    def wait(self, timeout: float | None = None, *, poll_s: float = 0.5, progress: TextIO | bool | None = None) -> Job:
        """Block until the job ends; raise ServiceError if it failed or was cancelled.

        `progress=True` (or a stream) draws a one-line progress bar, so a long search is visibly alive.
        """
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
            raise ServiceError(f"job {self.id} {self.status}: {self.data.get('error') or 'no error text'}", detail=self.data)
        return self

    def best(self) -> Strategy:
        return Strategy.parse(self.client._get_json(f"/v1/jobs/{self.id}/best"))

    def strategies(self) -> list[dict[str, Any]]:
        """Ranked candidates: each has the strategy, its prediction and, when trialled, its measurement."""
        return list(self.client._get_json(f"/v1/jobs/{self.id}/strategies")["data"])

    def cancel(self) -> Job:
        self.data = self.client._post_json(f"/v1/jobs/{self.id}/cancel", None)
        return self


def render_progress(job: dict[str, Any], width: int = 24) -> str:
    progress = job.get("progress") or {}
    budget = progress.get("trials_budget") or 0
    done = progress.get("trials_done") or 0
    fraction = done / budget if budget else (1.0 if job.get("status") in TERMINAL_STATUSES else 0.0)
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
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout, transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # --- plumbing ------------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
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
        return self._request("GET", path, params=clean).json()

    def _post_json(self, path: str, body: Any, **params: Any) -> Any:
        clean = {k: v for k, v in params.items() if v is not None}
        return self._request("POST", path, json=body, params=clean).json()

    # --- documents -----------------------------------------------------------------------------

    def upload_graph(self, graph: ModelGraph) -> str:
        return str(self._post_json("/v1/graphs", graph.model_dump(mode="json"))["id"])

    def upload_resources(self, resources: ResourceSpec) -> str:
        return str(self._post_json("/v1/resources", resources.model_dump(mode="json"))["id"])

    def graph(self, graph_id: str) -> ModelGraph:
        return ModelGraph.parse(self._get_json(f"/v1/graphs/{graph_id}"))

    def resources(self, resource_id: str) -> ResourceSpec:
        return ResourceSpec.parse(self._get_json(f"/v1/resources/{resource_id}"))

    def strategy(self, strategy_id: str) -> Strategy:
        return Strategy.parse(self._get_json(f"/v1/strategies/{strategy_id}"))

    def strategy_autodist(self, strategy_id: str) -> str:
        return self._request("GET", f"/v1/strategies/{strategy_id}", params={"format": "autodist"}).text

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
    ) -> Job:
        """Submit a job. `resources` may be a ResourceSpec or AutoDist resource_spec.yml text, whose
        nodes' GPU kind `device` names (the service's default, T4, when None). `max_trials=None`
        takes the service's default budget."""
        body: dict[str, Any] = {
            "graph": graph.model_dump(mode="json"),
            "resources": resources if isinstance(resources, str) else resources.model_dump(mode="json"),
            "max_trials": max_trials,
            "objective": objective,
        }
        if search:
            body["search"] = search
        if device is not None:
            body["device"] = device
        created = self._post_json("/v1/optimize", body)
        return Job(self, str(created["id"]), created)

    def job(self, job_id: str) -> Job:
        return Job(self, job_id).refresh()

    def jobs(self, *, status: str | None = None, limit: int = 50, offset: int = 0) -> list[dict[str, Any]]:
        return list(self._get_json("/v1/jobs", status=status, limit=limit, offset=offset)["data"])

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
            "strategy": strategy.model_dump(mode="json"),
            "step_times_s": step_times_s,
            "outcome": outcome,
            "job_id": job_id,
            "peak_memory_bytes": peak_memory_bytes,
            "error": error,
            **{key: value for key, value in summary.items() if value is not None},
        }
        return dict(self._post_json("/v1/trials", body))

    def trials(self, *, job_id: str | None = None, graph_id: str | None = None, limit: int = 100, offset: int = 0) -> list[dict[str, Any]]:
        return list(self._get_json("/v1/trials", job_id=job_id, graph_id=graph_id, limit=limit, offset=offset)["data"])

    def cost_model(self) -> dict[str, Any]:
        return dict(self._get_json("/v1/cost-model"))

    def health(self) -> dict[str, Any]:
        return dict(self._get_json("/healthz"))


def optimize(
    model: Any,
    resources: ResourceSpec | str,
    *,
    example_inputs: tuple[Any, ...] | None = None,
    batch_size: int | None = None,
    optimizer: str = "adam",
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
    `optimizer` kind) or a ModelGraph.
    """
    graph = model if isinstance(model, ModelGraph) else _capture(model, example_inputs, batch_size, optimizer)
    with Client(url, api_key=api_key) as client:
        job = client.optimize(graph, resources, max_trials=max_trials, search=search, device=device)
        return job.wait(timeout, progress=progress).best()


def _capture(model: Any, example_inputs: tuple[Any, ...] | None, batch_size: int | None, optimizer: str) -> ModelGraph:
    from stratagem.tracing import capture

    if example_inputs is None or batch_size is None:
        raise StratagemError("optimize(model, ...): a torch module needs example_inputs and batch_size to be captured")
    return capture(model, example_inputs, batch_size=batch_size, optimizer=optimizer)
