"""Content-addressed documents: graphs, resource specs and strategies, stored as their JSON.

The primary key is the document's content id (sha256 hex), so two uploads of the same document land
on one row and every job, candidate and trial refers to exactly what was optimized or measured.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, UTCDateTime, utcnow

CONTENT_ID = String(64)


class NamedDocument:
    """The columns of a document users upload and list by name: graphs and resource specs."""

    id: Mapped[str] = mapped_column(CONTENT_ID, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    json: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)


class GraphRow(NamedDocument, Base):
    __tablename__ = "graphs"


class ResourceSpecRow(NamedDocument, Base):
    __tablename__ = "resource_specs"


class StrategyRow(Base):
    """A strategy as first stored; per-job predictions and measurements live beside it, not in it."""

    __tablename__ = "strategies"

    id: Mapped[str] = mapped_column(CONTENT_ID, primary_key=True)
    graph_id: Mapped[str | None] = mapped_column(ForeignKey("graphs.id"), index=True)
    resource_id: Mapped[str | None] = mapped_column(ForeignKey("resource_specs.id"))
    json: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
