"""Operator traces: the ops of a graph's training step, stored beside the graph under their content id.

A trace is gzip-compressed JSON (`stratagem.tracing.OperatorTrace.to_bytes`), kept as those bytes:
a 7B decoder's trace is a few hundred kilobytes that way and many megabytes as a JSON column, and the
service only ever hands it on whole (to a trial's replay, or back to a client). Never a pickle.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, UTCDateTime, utcnow
from models.documents import CONTENT_ID


class OperatorTraceRow(Base):
    __tablename__ = "operator_traces"

    id: Mapped[str] = mapped_column(CONTENT_ID, primary_key=True)
    """The trace's content id: what `ModelGraph.trace_id` names."""
    graph_name: Mapped[str] = mapped_column(String(200))
    ops: Mapped[int] = mapped_column(Integer)
    """Forward, backward and optimizer ops together."""
    compressed_bytes: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    """gzip of the trace's JSON."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
