"""Storing and reading the content-addressed documents: graphs, resource specs, strategies, and the
operator traces stored beside graphs.

Inserts are `INSERT ... ON CONFLICT DO NOTHING` on the content id, so two requests uploading the
same document at once both succeed and agree on one row; `created` tells which one made it.
"""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from models import GraphRow, OperatorTraceRow, ResourceSpecRow, StrategyRow, utcnow
from optimizer_service.core.errors import not_found
from stratagem.ir import ModelGraph, ResourceSpec, Strategy
from stratagem.tracing.optrace import OperatorTrace

Row = TypeVar("Row", GraphRow, ResourceSpecRow, StrategyRow)


def insert_if_absent(session: Session, table: type[Any], values: dict[str, Any]) -> bool:
    """Insert a row keyed by `id` unless one exists; True when this call inserted it."""
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(table).values(**values).on_conflict_do_nothing(index_elements=["id"]).returning(table.id)
    return session.execute(statement).first() is not None


def store_graph(session: Session, graph: ModelGraph) -> tuple[GraphRow, bool]:
    created = insert_if_absent(
        session,
        GraphRow,
        {
            "id": graph.id,
            "name": column_text(graph.name, 200),
            "json": graph.model_dump(mode="json"),
            "created_at": utcnow(),
        },
    )
    return _get(session, GraphRow, str(graph.id), "graph"), created


def store_resources(session: Session, resources: ResourceSpec) -> tuple[ResourceSpecRow, bool]:
    """The spec's row, inserted unless this content is stored already."""
    values = {
        "id": resources.id,
        "name": column_text(resources.name, 200),
        "json": resources.model_dump(mode="json"),
        "created_at": utcnow(),
    }
    created = insert_if_absent(session, ResourceSpecRow, values)
    return _get(session, ResourceSpecRow, str(resources.id), "resource spec"), created


def store_strategy(
    session: Session, strategy: Strategy, *, graph_id: str | None, resource_id: str | None
) -> StrategyRow:
    values = {
        "id": strategy.id,
        "graph_id": graph_id,
        "resource_id": resource_id,
        "json": strategy.model_dump(mode="json"),
        "created_at": utcnow(),
    }
    insert_if_absent(session, StrategyRow, values)
    return _get(session, StrategyRow, str(strategy.id), "strategy")


def column_text(text: str, limit: int) -> str:
    """Text for a plain column: PostgreSQL text cannot hold NUL characters (JSON columns escape them)."""
    return text.replace("\x00", "")[:limit]


def get_graph_row(session: Session, graph_id: str, *, loc: list[str | int] | None = None) -> GraphRow:
    return _get(session, GraphRow, graph_id, "graph", loc=loc)


def get_resources_row(session: Session, resource_id: str, *, loc: list[str | int] | None = None) -> ResourceSpecRow:
    return _get(session, ResourceSpecRow, resource_id, "resource spec", loc=loc)


def get_strategy_row(session: Session, strategy_id: str, *, loc: list[str | int] | None = None) -> StrategyRow:
    return _get(session, StrategyRow, strategy_id, "strategy", loc=loc)


def load_graph(row: GraphRow) -> ModelGraph:
    return ModelGraph.parse(row.json)


def load_resources(row: ResourceSpecRow) -> ResourceSpec:
    return ResourceSpec.parse(row.json)


def load_strategy(row: StrategyRow) -> Strategy:
    return Strategy.parse(row.json)


def list_rows(session: Session, table: type[Row], *, limit: int, offset: int) -> tuple[list[Row], int]:
    count = session.scalar(select(func.count()).select_from(table)) or 0
    rows = session.scalars(select(table).order_by(table.created_at.desc(), table.id).limit(limit).offset(offset))
    return list(rows), count


def _get(session: Session, table: type[Row], ident: str, what: str, *, loc: list[str | int] | None = None) -> Row:
    row = session.get(table, ident)
    if row is None:
        raise not_found(what, ident, loc=loc)
    return row


def store_trace(session: Session, trace: OperatorTrace, data: bytes) -> tuple[OperatorTraceRow, bool]:
    """The trace's row, `data` being its gzip-compressed JSON, inserted unless this content is stored already."""
    values = {
        "id": trace.id,
        "graph_name": column_text(trace.graph_name, 200),
        "ops": trace.num_ops,
        "compressed_bytes": len(data),
        "data": data,
        "created_at": utcnow(),
    }
    created = insert_if_absent(session, OperatorTraceRow, values)
    row = session.get(OperatorTraceRow, str(trace.id))
    if row is None:
        raise not_found("operator trace", trace.id)
    return row, created


def get_trace_row(session: Session, trace_id: str, *, loc: list[str | int] | None = None) -> OperatorTraceRow:
    row = session.get(OperatorTraceRow, trace_id)
    if row is None:
        raise not_found("operator trace", trace_id, loc=loc)
    return row


def load_trace(session: Session, graph: ModelGraph) -> OperatorTrace | None:
    """The operator trace a graph names, when it is stored; None for a graph without one (its trials
    replay the graph's per-layer totals instead)."""
    if graph.trace_id is None:
        return None
    row = session.get(OperatorTraceRow, graph.trace_id)
    return OperatorTrace.from_bytes(row.data) if row is not None else None
