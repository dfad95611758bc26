"""Jinja2 for the dashboard: autoescaping always on, undefined names fail loudly, shared filters.

Graph, cluster and variable names are user-supplied; autoescape turns `<script>` in a name into
text. Figures reach the page through `figure_json`, which escapes `<`, `>` and `&` as JSON does
allow, so a name inside a chart cannot close the `<script type="application/json">` that carries it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from jinja2.utils import htmlsafe_json_dumps
from markupsafe import Markup

from optimizer_service.dashboard.charts import finite
from optimizer_service.dashboard.formatting import FILTERS

HERE = Path(__file__).resolve().parent
CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; worker-src 'self' blob:; object-src 'none'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
"""Scripts only from this service. plotly.js needs `unsafe-eval` (its WebGL charts compile code) and
inline styles (it styles its own SVG); no inline script is ever allowed, so injected markup cannot run."""


@cache
def templates() -> Jinja2Templates:
    environment = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(FILTERS)
    environment.filters["figure_json"] = figure_json
    return Jinja2Templates(env=environment)


def figure_json(spec: dict[str, Any]) -> Markup:
    """A figure as JSON safe to place inside `<script type="application/json">` (no `<`, `>`, `&`, NaN)."""
    return htmlsafe_json_dumps(finite(spec), allow_nan=False)


def render(request: Request, name: str, context: dict[str, Any], *, status: int = 200) -> HTMLResponse:
    """A page; `root` prefixes every link, so the service also works mounted under a path."""
    shared = {"root": str(request.scope.get("root_path", "")).rstrip("/"), "nav": "", "figures": {}}
    response = templates().TemplateResponse(request, name, {**shared, **context}, status_code=status)
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


def not_found(request: Request, what: str, ident: str) -> HTMLResponse:
    return render(
        request,
        "problem.html",
        {"title": f"No such {what}", "status": 404, "problems": [f"There is no {what} with id {ident!r}."]},
        status=404,
    )


def bad_request(request: Request, problems: list[str]) -> HTMLResponse:
    return render(
        request, "problem.html", {"title": "The request is not valid", "status": 422, "problems": problems}, status=422
    )


def unreadable(request: Request, error: Exception) -> HTMLResponse:
    """A stored document that no longer parses (written by an older schema): say which and why."""
    return render(
        request,
        "problem.html",
        {"title": "A stored document could not be read", "status": 500, "problems": [str(error)]},
        status=500,
    )
