"""Versions of the learned cost model: the boosters as XGBoost JSON text, never a pickle."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, UTCDateTime, utcnow


class CostModelVersion(Base):
    __tablename__ = "cost_model_versions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    version: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    booster: Mapped[str] = mapped_column(Text)
    """The whole model (boosters, feature names, metadata) as one JSON document."""
    n_train: Mapped[int] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    in_use: Mapped[bool] = mapped_column(Boolean, default=False)
