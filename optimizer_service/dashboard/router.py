"""The dashboard's routes: server-rendered pages at `/`, and the static files they load.

Handlers only parse the path and query, ask a page module for its context and render it. Pages read
the database through the API's own session dependency (and its read-key rule); they never call the
API over HTTP. Unknown or malformed ids answer an HTML 404 page, not a 500 or a JSON error.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, HTMLResponse, Response

from optimizer_service.api.deps import SessionDep, require_read_key
from optimizer_service.dashboard import templating
from optimizer_service.dashboard.cost_model_page import cost_model_context
from optimizer_service.dashboard.jobs_pages import job_context, jobs_list_context
from optimizer_service.dashboard.strategy_page import strategy_context
from optimizer_service.dashboard.templating import bad_request, not_found, render, unreadable
from optimizer_service.dashboard.trials_page import parse_query, trials_context
from stratagem.errors import StratagemError

pages = APIRouter(include_in_schema=False, dependencies=[Depends(require_read_key)])
assets = APIRouter(include_in_schema=False)

CONTENT_ID = re.compile(r"^[0-9a-f]{64}$")
STATIC = templating.HERE / "static"
OWN_ASSETS = {"dashboard.css": "text/css", "dashboard.js": "text/javascript"}


def _uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


@pages.get("/", response_class=HTMLResponse, name="dashboard_jobs")
def jobs_page(request: Request, session: SessionDep) -> HTMLResponse:
    return render(request, "jobs.html", {**jobs_list_context(session), "nav": "jobs"})


@pages.get("/jobs/{job_id}", response_class=HTMLResponse, name="dashboard_job")
def job_page(job_id: str, request: Request, session: SessionDep) -> HTMLResponse:
    parsed = _uuid(job_id)
    try:
        context = job_context(session, parsed) if parsed is not None else None
    except StratagemError as error:
        return unreadable(request, error)
    if context is None:
        return not_found(request, "job", job_id)
    return render(request, "job.html", {**context, "nav": "jobs"})


@pages.get("/strategies/{strategy_id}", response_class=HTMLResponse, name="dashboard_strategy")
def strategy_page(strategy_id: str, request: Request, session: SessionDep, job: str = "") -> HTMLResponse:
    job_id = _uuid(job) if job else None
    if job and job_id is None:
        return bad_request(request, [f"query.job: {job!r} is not a job id (a UUID)"])
    try:
        context = strategy_context(session, strategy_id, job_id) if CONTENT_ID.match(strategy_id) else None
    except StratagemError as error:
        return unreadable(request, error)
    if context is None:
        return not_found(request, "strategy", strategy_id)
    return render(request, "strategy.html", {**context, "nav": "jobs"})


@pages.get("/trials", response_class=HTMLResponse, name="dashboard_trials")
def trials_page(
    request: Request,
    session: SessionDep,
    job: str = "",
    graph: str = "",
    outcome: str = "",
    sort: str = "created",
    order: str = "desc",
) -> HTMLResponse:
    query, problems = parse_query(job, graph, outcome, sort, order)
    if query is None:
        return bad_request(request, problems)
    return render(request, "trials.html", {**trials_context(session, query), "nav": "trials"})


@pages.get("/cost-model", response_class=HTMLResponse, name="dashboard_cost_model")
def cost_model_page(request: Request, session: SessionDep, version: str = "") -> HTMLResponse:
    if version and not version.isdigit():
        return bad_request(request, [f"query.version: {version!r} is not a version id (a whole number)"])
    context = cost_model_context(session, int(version) if version else None)
    if context is None:
        return not_found(request, "cost-model version", version)
    return render(request, "cost_model.html", {**context, "nav": "cost-model"})


@assets.get("/static/{name}", name="dashboard_static")
def static_file(name: str, request: Request) -> Response:
    """Our CSS and JS, and plotly.js from the installed `plotly` package (never a CDN, never a copy)."""
    if name == "plotly.min.js":
        path = plotly_js_path()
        if path is None:
            return not_found(request, "static file (the plotly package is not installed)", name)
        return FileResponse(path, media_type="text/javascript", headers={"Cache-Control": "public, max-age=86400"})
    if name not in OWN_ASSETS:
        return not_found(request, "static file", name)
    return FileResponse(STATIC / name, media_type=OWN_ASSETS[name], headers={"Cache-Control": "no-cache"})


def plotly_js_path() -> Path | None:
    try:
        import plotly
    except ImportError:
        return None
    path = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
    return path if path.is_file() else None


router = APIRouter()
router.include_router(pages)
router.include_router(assets)
