"""The principled simulator: step time, memory and a cost breakdown for (graph, cluster, strategy).

Two ways in:
- `simulate(graph, resources, strategies) -> list[Prediction]` for a handful of Strategy objects
  (`simulate_each`: None for the ones it refuses, instead of raising);
- `compile_context` once, then `simulate_batch(context, batch)` on a `CandidateBatch` (arrays, see
  `simulator.encoding`) for search, and `predictions(context, batch, indices)` for the few to explain.

Formulas live one per module: collectives in `collectives`, compute in `compute`, compression in
`compression`, the parameter-server load in `ps`, pipeline and tensor parallel in `pipeline`, memory
in `memory`; `engine` only wires them. `docs/simulator.md` explains the model.
"""

from simulator.api import SIMULATOR_VERSION, context_for, simulate, simulate_each
from simulator.codec import encode, to_strategy
from simulator.context import SimContext, compile_context
from simulator.encoding import (
    Algorithm,
    CandidateBatch,
    CompressorKind,
    ConsistencyKind,
    Precision,
    Schedule,
    SyncKind,
)
from simulator.engine import BREAKDOWN_KEYS, BatchResult, simulate_batch
from simulator.prediction import Prediction, predictions

__all__ = [
    "BREAKDOWN_KEYS",
    "SIMULATOR_VERSION",
    "Algorithm",
    "BatchResult",
    "CandidateBatch",
    "CompressorKind",
    "ConsistencyKind",
    "Precision",
    "Prediction",
    "Schedule",
    "SimContext",
    "SyncKind",
    "compile_context",
    "context_for",
    "encode",
    "predictions",
    "simulate",
    "simulate_batch",
    "simulate_each",
    "to_strategy",
]
