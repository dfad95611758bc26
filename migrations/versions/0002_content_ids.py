"""Content ids without defaults, and `recompute` in place of `recompute_activations`: stored documents rewritten.

A document's content id is now the hash of its content with every field at its default left out, at
any depth, and a strategy says `recompute: "none" | "selective" | "full"` where it said
`recompute_activations: true | false` (true is "full"). This revision parses every stored graph,
resource spec and strategy under the present schema, stores it under its new id, and points every
reference at the new ids: the strategies' own `graph_id`/`resources_id` (part of their content, so
graphs and specs go first), the foreign-key columns of strategies, jobs, job candidates and trials,
and the ids copied into JSON (a job's result, a trial's details, a cost model's group names).

A document that does not parse under the present schema is left as it was, with a warning: it stays
readable by id, and nothing that refers to it breaks.

Revision ID: 0002_content_ids
Revises: 0001_initial
Create Date: 2026-11-27
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0002_content_ids"
down_revision = "0001_initial"
branch_labels = None
depends_on = None

log = logging.getLogger("alembic.runtime.migration")

GRAPHS = sa.table(
    "graphs", sa.column("id"), sa.column("name"), sa.column("json", sa.JSON), sa.column("created_at", sa.DateTime)
)
SPECS = sa.table(
    "resource_specs",
    sa.column("id"),
    sa.column("name"),
    sa.column("json", sa.JSON),
    sa.column("created_at", sa.DateTime),
)
STRATEGIES = sa.table(
    "strategies",
    sa.column("id"),
    sa.column("graph_id"),
    sa.column("resource_id"),
    sa.column("json", sa.JSON),
    sa.column("created_at", sa.DateTime),
)
JOBS = sa.table(
    "jobs",
    sa.column("id", sa.Uuid),
    sa.column("graph_id"),
    sa.column("resource_id"),
    sa.column("best_strategy_id"),
    sa.column("result", sa.JSON),
)
CANDIDATES = sa.table("job_candidates", sa.column("id"), sa.column("job_id", sa.Uuid), sa.column("strategy_id"))
TRIALS = sa.table(
    "trials",
    sa.column("id", sa.Uuid),
    sa.column("graph_id"),
    sa.column("resource_id"),
    sa.column("strategy_id"),
    sa.column("details", sa.JSON),
)
COST_MODELS = sa.table("cost_model_versions", sa.column("id"), sa.column("metrics", sa.JSON), sa.column("booster"))

GROUP = re.compile(r"\b([0-9a-f]{16})@([0-9a-f]{16})\b")
"""A cost-model group name: the first 16 hex digits of a graph id and of a resource spec id."""


def upgrade() -> None:
    from stratagem.ir import ModelGraph, ResourceSpec

    bind = op.get_bind()
    graphs = _rewrite_named(bind, GRAPHS, lambda data: ModelGraph.model_validate(data))
    specs = _rewrite_named(bind, SPECS, lambda data: ResourceSpec.model_validate(data))
    strategies = _rewrite_strategies(bind, graphs, specs)
    ids = {**graphs, **specs, **strategies}
    documents = {"graph_id": graphs, "resource_id": specs}
    _repoint(bind, JOBS, {**documents, "best_strategy_id": strategies}, "result", ids)
    _repoint_candidates(bind, strategies)
    _repoint(bind, TRIALS, {**documents, "strategy_id": strategies}, "details", ids)
    _repoint_cost_models(bind, ids)
    _delete(bind, STRATEGIES, strategies)
    _delete(bind, GRAPHS, graphs)
    _delete(bind, SPECS, specs)


def downgrade() -> None:
    """Ids cannot be recomputed the old way without the old schema; the rewritten documents stay."""


def _rewrite_named(bind: sa.Connection, table: sa.TableClause, parse: Any) -> dict[str, str]:
    """Rewrite each row's document; the old -> new ids of those whose id changed."""
    moved: dict[str, str] = {}
    for row in bind.execute(sa.select(table)).mappings().all():
        document = _parsed(table.name, row["id"], row["json"], parse)
        if document is None:
            continue
        new_id = _store(bind, table, row, document, name=row["name"])
        if new_id is not None:
            moved[row["id"]] = new_id
    return moved


def _rewrite_strategies(bind: sa.Connection, graphs: dict[str, str], specs: dict[str, str]) -> dict[str, str]:
    from stratagem.ir import Strategy

    moved: dict[str, str] = {}
    for row in bind.execute(sa.select(STRATEGIES)).mappings().all():
        data = dict(row["json"])
        if "recompute_activations" in data:
            data["recompute"] = "full" if data.pop("recompute_activations") else "none"
        for key, mapping in (("graph_id", graphs), ("resources_id", specs)):
            if data.get(key) in mapping:
                data[key] = mapping[data[key]]
        columns = {
            "graph_id": graphs.get(row["graph_id"], row["graph_id"]),
            "resource_id": specs.get(row["resource_id"], row["resource_id"]),
        }
        document = _parsed("strategies", row["id"], data, Strategy.model_validate)
        if document is None:  # kept as it was, but pointing at its graph and spec under their new ids
            bind.execute(sa.update(STRATEGIES).where(STRATEGIES.c.id == row["id"]).values(**columns))
            continue
        new_id = _store(bind, STRATEGIES, row, document, **columns)
        if new_id is not None:
            moved[row["id"]] = new_id
    return moved


def _store(bind: sa.Connection, table: sa.TableClause, row: sa.RowMapping, document: Any, **columns: Any) -> str | None:
    """`row` rewritten as `document` with `columns`: in place while its id is unchanged, else as a new row
    (one only, when two old documents are one under the new id). The new id, if it moved."""
    new_id, data = str(document.id), document.model_dump(mode="json")
    if new_id == row["id"]:
        bind.execute(sa.update(table).where(table.c.id == row["id"]).values(json=data, **columns))
        return None
    if not bind.execute(sa.select(table.c.id).where(table.c.id == new_id)).first():
        bind.execute(sa.insert(table).values(id=new_id, json=data, created_at=row["created_at"], **columns))
    return new_id


def _parsed(table: str, ident: str, data: Any, parse: Any) -> Any:
    content = {key: value for key, value in dict(data).items() if key != "id"}
    try:
        return parse(content)
    except ValueError as error:  # pydantic's ValidationError is a ValueError
        log.warning("%s %s does not parse under the present schema; left as it was: %s", table, ident, error)
        return None


def _repoint(
    bind: sa.Connection, table: sa.TableClause, columns: dict[str, dict[str, str]], document: str, ids: dict[str, str]
) -> None:
    """Point each row's id `columns` at the new ids (each through its own old -> new map) and rename every
    old id in its JSON `document` column."""
    for row in bind.execute(sa.select(table)).mappings().all():
        values = {column: moved.get(row[column], row[column]) for column, moved in columns.items()}
        values[document] = _renamed(row[document], ids)
        bind.execute(sa.update(table).where(table.c.id == row["id"]).values(**values))


def _repoint_candidates(bind: sa.Connection, strategies: dict[str, str]) -> None:
    for row in bind.execute(sa.select(CANDIDATES)).mappings().all():
        new_id = strategies.get(row["strategy_id"])
        if new_id is None:
            continue
        clash = bind.execute(
            sa.select(CANDIDATES.c.id).where(CANDIDATES.c.job_id == row["job_id"], CANDIDATES.c.strategy_id == new_id)
        ).first()
        if clash:  # two old strategies that are one under the new ids: the job keeps one candidate
            bind.execute(sa.delete(CANDIDATES).where(CANDIDATES.c.id == row["id"]))
        else:
            bind.execute(sa.update(CANDIDATES).where(CANDIDATES.c.id == row["id"]).values(strategy_id=new_id))


def _repoint_cost_models(bind: sa.Connection, ids: dict[str, str]) -> None:
    for row in bind.execute(sa.select(COST_MODELS)).mappings().all():
        booster = _renamed_text(row["booster"], ids) if row["booster"] else row["booster"]
        bind.execute(
            sa.update(COST_MODELS)
            .where(COST_MODELS.c.id == row["id"])
            .values(metrics=_renamed(row["metrics"], ids), booster=booster)
        )


def _renamed(value: Any, ids: dict[str, str]) -> Any:
    """JSON with every old id (and every group name made of old ids) replaced by the new one."""
    if value is None or not ids:
        return value
    return json.loads(_renamed_text(json.dumps(value), ids))


def _renamed_text(text: str, ids: dict[str, str]) -> str:
    if not ids:
        return text
    text = re.sub(r"\b[0-9a-f]{64}\b", lambda m: ids.get(m.group(0), m.group(0)), text)
    prefixes = {old[:16]: new[:16] for old, new in ids.items()}
    return GROUP.sub(lambda m: f"{prefixes.get(m.group(1), m.group(1))}@{prefixes.get(m.group(2), m.group(2))}", text)


def _delete(bind: sa.Connection, table: sa.TableClause, moved: dict[str, str]) -> None:
    for old in moved:
        bind.execute(sa.delete(table).where(table.c.id == old))
