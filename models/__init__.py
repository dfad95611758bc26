"""The persistent data model: SQLAlchemy 2 typed ORM tables, shared by the service and its migrations.

Documents (graphs, resource specs, strategies, operator traces) are keyed by their content id, so storing the same
document twice is a no-op. Everything structured is a JSON column (portable between SQLite and
PostgreSQL); nothing is pickled.
"""

from models.base import Base, UTCDateTime, utcnow
from models.cost_model import CostModelVersion
from models.documents import GraphRow, ResourceSpecRow, StrategyRow
from models.jobs import Job, JobCandidate, JobPhase, JobStatus
from models.traces import OperatorTraceRow
from models.trials import Trial

__all__ = [
    "Base",
    "CostModelVersion",
    "GraphRow",
    "Job",
    "JobCandidate",
    "JobPhase",
    "JobStatus",
    "OperatorTraceRow",
    "ResourceSpecRow",
    "StrategyRow",
    "Trial",
    "UTCDateTime",
    "utcnow",
]
