"""AutoDist's names for all-reduce specs and compressors, and what they mean in Stratagem's IR.

Builders take AutoDist's names as arguments (so AutoDist users keep their habits) and the AutoDist
interop reads and writes them; both use these tables so the two can never disagree.
"""

from __future__ import annotations

from typing import Literal

from stratagem.ir import Compressor

SPEC_TO_ALGORITHM: dict[str, Literal["auto", "ring"]] = {"AUTO": "auto", "NCCL": "auto", "RING": "ring"}
"""AutoDist `AllReduceSynchronizer.Spec` -> `AllReduceSynchronizer.algorithm`.

NCCL and AUTO both mean "let the runtime choose" here: Stratagem picks the backend (NCCL on GPUs,
gloo on CPUs) from the device, and NCCL itself chooses ring or tree.
"""

ALGORITHM_TO_SPEC: dict[str, str] = {"auto": "AUTO", "ring": "RING"}
"""The reverse, for export; `tree` and `hierarchical` have no AutoDist spec."""

POWERSGD_RANK = 1
"""AutoDist's PowerSGDCompressor has a fixed rank of 1 (its constructor default, never set by a builder)."""

COMPRESSORS: dict[str, Compressor] = {
    "NoneCompressor": Compressor(kind="none"),
    "HorovodCompressor": Compressor(kind="fp16", error_feedback=False),
    "HorovodCompressorEF": Compressor(kind="fp16", error_feedback=True),
    "PowerSGDCompressor": Compressor(kind="powersgd", rank=POWERSGD_RANK, error_feedback=True),
}
"""AutoDist `AllReduceSynchronizer.Compressor` -> Stratagem's compressor.

Horovod's compression casts gradients to fp16 for the wire; the EF variant adds error feedback.
AutoDist's PowerSGD always feeds the error back (it subclasses CompressorEF).
"""


def compressor_for(name: str) -> Compressor:
    """A fresh copy, so a strategy edited in place can never change this table or another variable."""
    return COMPRESSORS[name].model_copy()


def compressor_name(compressor: Compressor) -> str | None:
    """AutoDist's name for a compressor, or None when AutoDist has no equivalent.

    `none` maps to NoneCompressor whatever its (meaningless) error_feedback flag says.
    """
    if compressor.kind == "none":
        return "NoneCompressor"
    for name, known in COMPRESSORS.items():
        if known == compressor:
            return name
    return None
