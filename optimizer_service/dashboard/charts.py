"""Plotly figures as plain dicts (`{"data": [...], "layout": {...}}`), drawn in the browser by plotly.js.

The server decides what a chart says; the page only hands the dict to `Plotly.newPlot`. Step times
are plotted in milliseconds, sizes in megabytes, so axes need no per-chart unit logic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from optimizer_service.dashboard.knobs import ASP_STALENESS, Knobs
from simulator import BREAKDOWN_KEYS, metrics

Figure = dict[str, Any]

PALETTE = ["#2f6fdf", "#e8833a", "#3aa76d", "#c44e52", "#8172b2", "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd"]
MS = 1e3
MB = 1e-6


def _layout(title: str, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "title": {"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 15}},
        "margin": {"l": 60, "r": 20, "t": 48, "b": 50},
        "font": {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12, "color": "#1f2933"},
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "#ffffff",
        "colorway": PALETTE,
        "xaxis": {"automargin": True},
        "yaxis": {"automargin": True},
        "height": 360,
    }
    for axis in ("xaxis", "yaxis"):
        layout[axis] = {**layout[axis], **extra.pop(axis, {})}
    layout.update(extra)
    return layout


def breakdown_chart(
    labels: Sequence[str],
    breakdowns: Sequence[dict[str, float]],
    *,
    title: str = "Predicted cost breakdown per candidate",
) -> Figure:
    """Stacked bars: where each candidate's predicted step goes; the stack adds up to the step time."""
    keys = list(BREAKDOWN_KEYS) + sorted({k for b in breakdowns for k in b} - set(BREAKDOWN_KEYS))
    used = [k for k in keys if any(b.get(k, 0.0) > 0 for b in breakdowns)]
    data = [
        {
            "type": "bar",
            "name": key.replace("_", " "),
            "x": list(labels),
            "y": [b.get(key, 0.0) * MS for b in breakdowns],
            "hovertemplate": "%{x}<br>" + key.replace("_", " ") + ": %{y:.4g} ms<extra></extra>",
        }
        for key in used
    ]
    return {
        "data": data,
        "layout": _layout(title, barmode="stack", height=420, yaxis={"title": {"text": "seconds of the step (ms)"}}),
    }


def predicted_vs_measured_bars(
    labels: Sequence[str], predicted: Sequence[float | None], measured: Sequence[float | None]
) -> Figure:
    data = [
        {"type": "bar", "name": "predicted", "x": list(labels), "y": [_ms(v) for v in predicted]},
        {"type": "bar", "name": "measured", "x": list(labels), "y": [_ms(v) for v in measured]},
    ]
    return {
        "data": data,
        "layout": _layout(
            "Predicted vs measured step time", barmode="group", height=420, yaxis={"title": {"text": "step time (ms)"}}
        ),
    }


def space_chart(knobs: dict[str, float]) -> Figure:
    names = sorted(knobs, key=lambda k: knobs[k])
    data = [
        {
            "type": "bar",
            "orientation": "h",
            "y": [n.replace("_", " ") for n in names],
            "x": [knobs[n] for n in names],
            "marker": {"color": PALETTE[0]},
            "hovertemplate": "%{y}: 10^%{x:.3g} choices<extra></extra>",
        }
    ]
    return {
        "data": data,
        "layout": _layout(
            "Choices each knob offers (log10)",
            xaxis={"title": {"text": "log10 of choices"}},
            margin={"l": 120, "r": 20, "t": 48, "b": 50},
            showlegend=False,
        ),
    }


def step_time_over_time(times: Sequence[str], step_times: Sequence[float], labels: Sequence[str]) -> Figure:
    """Every successful trial's median step time in time order, and the fastest so far."""
    best: list[float] = []
    for value in step_times:
        best.append(min(value, best[-1]) if best else value)
    data = [
        {
            "type": "scatter",
            "mode": "markers",
            "name": "trial",
            "x": list(times),
            "y": [v * MS for v in step_times],
            "text": list(labels),
            "hovertemplate": "%{text}<br>%{y:.4g} ms<extra></extra>",
        },
        {
            "type": "scatter",
            "mode": "lines",
            "name": "best so far",
            "x": list(times),
            "y": [v * MS for v in best],
            "line": {"shape": "hv", "width": 2},
        },
    ]
    return {
        "data": data,
        "layout": _layout(
            "Measured step time over time",
            yaxis={"title": {"text": "median step time (ms)"}},
            xaxis={"title": {"text": "recorded at (UTC)"}},
        ),
    }


def mape(predicted: Sequence[float], measured: Sequence[float]) -> float | None:
    pairs = [(p, m) for p, m in zip(predicted, measured, strict=True) if m > 0]
    return metrics.mape(measured=[m for _, m in pairs], predicted=[p for p, _ in pairs]) if pairs else None


def predicted_vs_measured_scatter(
    predicted: Sequence[float], measured: Sequence[float], labels: Sequence[str]
) -> Figure:
    error = mape(predicted, measured)
    title = (
        f"Predicted vs measured (MAPE {error * 100:.1f}%, {len(measured)} trials)"
        if error is not None
        else "Predicted vs measured"
    )
    values = [v * MS for v in [*predicted, *measured]]
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    data = [
        {
            "type": "scatter",
            "mode": "markers",
            "name": "trial",
            "x": [p * MS for p in predicted],
            "y": [m * MS for m in measured],
            "text": list(labels),
            "hovertemplate": "%{text}<br>predicted %{x:.4g} ms<br>measured %{y:.4g} ms<extra></extra>",
        },
        {
            "type": "scatter",
            "mode": "lines",
            "name": "exact",
            "x": [low, high],
            "y": [low, high],
            "line": {"dash": "dot", "color": "#8c8c8c"},
            "hoverinfo": "skip",
        },
    ]
    return {
        "data": data,
        "layout": _layout(
            title, xaxis={"title": {"text": "predicted (ms)"}}, yaxis={"title": {"text": "measured (ms)"}}
        ),
    }


def knobs_parcoords(knobs: Sequence[Knobs], step_times: Sequence[float]) -> Figure:
    stalenesses = sorted({k.staleness for k in knobs} | {0})
    staleness = {
        "label": "staleness",
        "values": [k.staleness for k in knobs],
        "tickvals": stalenesses,
        "ticktext": ["asp" if s == ASP_STALENESS else str(s) for s in stalenesses],
    }
    dimensions = [
        {"label": "PS bytes (fraction)", "values": [k.ps_bytes_fraction for k in knobs], "range": [0, 1]},
        {"label": "fusion groups", "values": [k.groups for k in knobs]},
        {"label": "shards (most)", "values": [k.max_shards for k in knobs]},
        {"label": "compressed (fraction)", "values": [k.compressed_fraction for k in knobs], "range": [0, 1]},
        staleness,
        {"label": "step time (ms)", "values": [t * MS for t in step_times]},
    ]
    line = {
        "color": [t * MS for t in step_times],
        "colorscale": "Viridis",
        "reversescale": True,
        "showscale": True,
        "colorbar": {"title": {"text": "ms"}},
    }
    data = [{"type": "parcoords", "line": line, "dimensions": dimensions}]
    return {
        "data": data,
        "layout": _layout(
            "Strategy knobs of successful trials", height=420, margin={"l": 60, "r": 60, "t": 110, "b": 30}
        ),
    }


def destination_chart(bytes_by_destination: dict[str, float]) -> Figure:
    names = list(bytes_by_destination)
    data = [
        {
            "type": "bar",
            "orientation": "h",
            "y": names,
            "x": [bytes_by_destination[n] * MB for n in names],
            "marker": {"color": PALETTE[2]},
            "hovertemplate": "%{y}: %{x:.4g} MB<extra></extra>",
        }
    ]
    height = max(240, 60 + 26 * len(names))
    return {
        "data": data,
        "layout": _layout(
            "Bytes synchronized per destination",
            height=height,
            showlegend=False,
            xaxis={"title": {"text": "MB per step"}},
            yaxis={"automargin": True},
            margin={"l": 20, "r": 20, "t": 48, "b": 50},
        ),
    }


def importance_chart(importances: dict[str, float], *, top: int = 20) -> Figure:
    ranked = sorted(importances.items(), key=lambda item: item[1], reverse=True)[:top][::-1]
    data = [
        {
            "type": "bar",
            "orientation": "h",
            "y": [n for n, _ in ranked],
            "x": [v for _, v in ranked],
            "marker": {"color": PALETTE[1]},
            "hovertemplate": "%{y}: %{x:.3f}<extra></extra>",
        }
    ]
    return {
        "data": data,
        "layout": _layout(
            "Feature importance (share of total gain)",
            height=max(280, 60 + 22 * len(ranked)),
            showlegend=False,
            yaxis={"automargin": True},
            margin={"l": 20, "r": 20, "t": 48, "b": 40},
        ),
    }


def metrics_chart(names: Sequence[str], simulator: Sequence[float | None], corrected: Sequence[float | None]) -> Figure:
    data = [
        {"type": "bar", "name": "simulator alone", "x": list(names), "y": [_finite(v) for v in simulator]},
        {"type": "bar", "name": "with learned correction", "x": list(names), "y": [_finite(v) for v in corrected]},
    ]
    return {
        "data": data,
        "layout": _layout("Cross-validated scores (MAPE and regret: lower is better; tau: higher)", barmode="group"),
    }


def finite(value: Any) -> Any:
    """The figure with NaN and infinities replaced by None: JSON has no NaN, and JSON.parse would throw."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def plot_time(moment: datetime) -> str:
    """A UTC time as plotly.js reads it: no offset suffix, which it would not parse."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _ms(value: float | None) -> float | None:
    return value * MS if value is not None else None


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
