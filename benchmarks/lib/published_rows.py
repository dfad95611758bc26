"""Published GPU measurements (`shared/published/gpu_measurements.csv`), typed, and how rows group.

A row becomes a model to capture (`published_models`), a cluster and a `stratagem.Layout` with the
reasons the project cannot state it yet (`published_layouts`); here are the row itself, the groups
Kendall tau compares within (one model on one cluster) and the series scaling error follows (one
configuration on growing GPU counts).
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COLUMNS = (
    "source",
    "source_path",
    "model_family",
    "model_config",
    "precision",
    "gpu",
    "n_gpus",
    "gpus_per_node",
    "intra_node_link",
    "inter_node_gbps",
    "global_batch",
    "micro_batch",
    "dp",
    "tp",
    "pp",
    "zero_stage",
    "recompute",
    "other_layout",
    "measured_metric",
    "measured_value",
    "notes",
    "derived_iteration_s",
)
GIB = 1024**3


@dataclass(frozen=True)
class Row:
    """One published measurement, typed; `id` is `source:n`, n counting the source's rows from 1."""

    id: str
    source: str
    source_path: str
    family: str
    config: dict[str, Any]
    precision: str
    gpu: str
    n_gpus: int
    gpus_per_node: int
    intra_node_link: str
    inter_node_gbps: float | None
    global_batch: int
    micro_batch: int
    dp: int
    tp: int
    pp: int
    zero_stage: int
    recompute: str
    other: dict[str, Any]
    measured_metric: str
    measured_value: float
    notes: str
    measured_step_s: float
    """`derived_iteration_s`: seconds per optimizer step, the figure the prediction is compared with."""
    raw: dict[str, str] = field(repr=False, compare=False, default_factory=dict)

    @property
    def model(self) -> str:
        """The model's name: Megatron's and torchtitan's `name`, the Hugging Face model id, or torchvision's."""
        return str(self.config.get("name") or self.config.get("hf_model") or self.config.get("torchvision"))

    @property
    def seq(self) -> int | None:
        return int(self.config["seq"]) if "seq" in self.config else None

    @property
    def measured_memory_bytes(self) -> float | None:
        """Peak memory the source reports in its notes (torchtitan's `Memory 82.4 GiB`), if any."""
        found = re.search(r"Memory (\d+(?:\.\d+)?) GiB", self.notes)
        return float(found.group(1)) * GIB if found else None


def read_rows(path: str | Path) -> list[Row]:
    """Every row of the CSV, in file order; a malformed row raises ValueError naming its line and column."""
    with Path(path).open(newline="", encoding="utf-8") as stream:
        reader = csv.DictReader(stream)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
        counts: dict[str, int] = {}
        rows = []
        for line, raw in enumerate(reader, start=2):
            counts[raw["source"]] = counts.get(raw["source"], 0) + 1
            try:
                rows.append(_row(raw, f"{raw['source']}:{counts[raw['source']]}"))
            except (KeyError, ValueError, TypeError) as error:
                raise ValueError(f"{path}:{line}: {error}") from None
    return rows


def _row(raw: dict[str, str], ident: str) -> Row:
    def integer(name: str) -> int:
        return int(raw[name])

    gbps = raw["inter_node_gbps"].strip()
    return Row(
        id=ident,
        source=raw["source"],
        source_path=raw["source_path"],
        family=raw["model_family"],
        config=json.loads(raw["model_config"]),
        precision=raw["precision"],
        gpu=raw["gpu"],
        n_gpus=integer("n_gpus"),
        gpus_per_node=integer("gpus_per_node"),
        intra_node_link=raw["intra_node_link"],
        inter_node_gbps=float(gbps) if gbps else None,
        global_batch=integer("global_batch"),
        micro_batch=integer("micro_batch"),
        dp=integer("dp"),
        tp=integer("tp"),
        pp=integer("pp"),
        zero_stage=integer("zero_stage"),
        recompute=raw["recompute"],
        other=json.loads(raw["other_layout"] or "{}"),
        measured_metric=raw["measured_metric"],
        measured_value=float(raw["measured_value"]),
        notes=raw["notes"],
        measured_step_s=float(raw["derived_iteration_s"]),
        raw=dict(raw),
    )


# --- groups -----------------------------------------------------------------------------------


def cluster_key(row: Row) -> str:
    """One model on one cluster kind: what Kendall tau compares within."""
    return f"{row.source}|{row.model}|{row.gpu}"


SERIES_FLAGS = ("variant", "cp", "compile", "float8", "async_tp", "fsdp_float8_all_gather", "virtual_pipeline_chunks")
"""`other_layout` keys that make two runs different configurations (the rest describe the same run)."""


def series_key(row: Row) -> str:
    """Rows that differ only in GPU count (and the data degree and global batch that follow it)."""
    flags = ",".join(f"{k}={row.other[k]}" for k in SERIES_FLAGS if k in row.other)
    layout = f"mb={row.micro_batch},seq={row.seq},tp={row.tp},pp={row.pp},zero={row.zero_stage},{row.recompute}"
    return "|".join([row.source, row.model, row.gpu, row.precision, layout, flags])


def samples_per_s(row: Row) -> float:
    return row.global_batch / row.measured_step_s if row.measured_step_s > 0 else math.nan
