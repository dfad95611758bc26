"""A layout as one line of `key=value` pairs, the form the CLI takes: `dp=8,tp=4,pp=2,mb=1,gbs=512`."""

from __future__ import annotations

from typing import Any

from stratagem.errors import InvalidLayoutError, Problem
from stratagem.layout import Layout

LAYOUT_KEYS: dict[str, str] = {
    "dp": "data",
    "tp": "tensor",
    "pp": "pipeline",
    "cp": "context",
    "mb": "micro_batch",
    "gbs": "global_batch",
    "m": "micro_batches",
    "schedule": "schedule",
    "vpp": "virtual_stages",
    "zero": "zero",
    "shard": "shard_group",
    "bucket": "bucket_mb",
    "overlap": "overlap_grad_reduce",
    "recompute": "recompute",
    "precision": "precision",
    "sp": "sequence_parallel",
    "async_tp": "async_tensor_parallel",
    "fp8_ag": "fp8_all_gather",
    "compile": "compile",
}
"""Short key -> Layout field; the field names themselves are accepted too (`data=8`)."""
ALIASES = {"ac": "recompute", "fsdp": "zero"}
UNSET = ("auto", "-1", "none")
"""Values that leave a degree or batch for `build()` to fill (torchtitan writes -1)."""
TRUE, FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def parse_layout(text: str) -> Layout:
    """`"dp=8,tp=4,sp"`: pairs separated by commas (or spaces); a bare key is a flag set to true."""
    fields: dict[str, Any] = {}
    problems: list[Problem] = []
    for item in text.replace(" ", ",").split(","):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip().lower().replace("-", "_")
        key = ALIASES.get(key, key)
        field = LAYOUT_KEYS.get(key, key)
        if field not in Layout.model_fields or field in ("id", "schema_version"):
            known = ", ".join(f"{short} ({name})" for short, name in LAYOUT_KEYS.items())
            problems.append(Problem(key or item, f"unknown layout key; known: {known}"))
            continue
        if field in fields:
            problems.append(Problem(key, "given twice"))
            continue
        fields[field] = _value(field, value.strip().lower() if sep else "true")
    if problems:
        raise InvalidLayoutError(problems)
    return Layout.parse(fields)


def _value(field: str, text: str) -> Any:
    annotation = Layout.model_fields[field].annotation
    if annotation is bool:
        return True if text in TRUE else False if text in FALSE else text
    if text in UNSET and "None" in str(annotation):
        return None
    return int(text) if text.isdigit() else text


def layout_text(layout: Layout) -> str:
    """The short form, leaving out what is at its default (a None degree shows as `auto`)."""
    parts = []
    for short, field in LAYOUT_KEYS.items():
        value = getattr(layout, field)
        default = Layout.model_fields[field].default
        if field == "data":
            parts.append(f"{short}={'auto' if value is None else value}")
        elif value != default:
            shown = "auto" if value is None else str(value).lower() if isinstance(value, bool) else value
            parts.append(f"{short}={shown}")
    return ",".join(parts)
