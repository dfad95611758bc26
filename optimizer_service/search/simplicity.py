"""Which answer a user can trust: the simpler strategy, unless a more complex one gains more than the
prediction's own uncertainty.

A prediction carries an error nobody sees until a trial runs. Between two strategies predicted within
that error of each other, the simpler one is the better answer: every trainer runs it, it fails in
fewer ways, and a measurement rarely reverses the call. So the answer is the simplest candidate whose
throughput is within the bar of the fastest one; the fastest wins only when its gain over every simpler
candidate exceeds the bar.

Simplicity, simplest first (`simplicity_of`, from the Strategy document alone):

0. `data_parallel`: every replica holds the whole model (data-parallel mesh only: no tensor, pipeline
   or context split), every trainable variable all-reduced whole and uncompressed, BSP: what DDP does.
1. `fsdp`: the same mesh with every trainable variable sharded ZeRO/FSDP-style (any stage).
2. `builder`: the unchanged strategy of any other pre-built AutoDist builder (PS, Parallax, ...).
3. `searched`: anything else: mixed synchronizers, partitions, a tensor/pipeline/context layout,
   compression, relaxed consistency.

Gradient accumulation, activation recomputation, precision, compile, async tensor parallelism and fp8
all-gathers do not count: each is one switch in every trainer. Among candidates of one kind the faster is preferred, so "the best builder" is the
fastest builder within the bar.

The bar is the fastest candidate's own uncertainty: with the learned correction, the upper half of its
interval relative to its step time, (high − mid) / mid, the distance to the slowest it plausibly runs;
never below `FLOOR` (3%), which stands for what neither the simulator nor the model sees (a learned
interval narrower than that is trusted no further). Measured candidates are compared with the
measurement's own noise instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any

from stratagem.builders import BUILDERS
from stratagem.ir import AllReduceSynchronizer, ShardedSynchronizer, Strategy

FLOOR = 0.03
"""The least relative gain a more complex strategy must be predicted to bring."""


class Simplicity(IntEnum):
    data_parallel = 0
    fsdp = 1
    builder = 2
    searched = 3

    @property
    def words(self) -> str:
        return {
            Simplicity.data_parallel: "plain data parallel",
            Simplicity.fsdp: "FSDP/ZeRO sharding",
            Simplicity.builder: "a pre-built strategy",
            Simplicity.searched: "a searched strategy",
        }[self]


class Rule(StrEnum):
    """Which rule decided a job's answer (`result.decision.rule`)."""

    fastest_is_simplest = "fastest_is_simplest"
    """No feasible candidate is simpler than the fastest one."""
    simpler_within_uncertainty = "simpler_within_uncertainty"
    """A simpler candidate is within the bar of the fastest: the simpler one is the answer."""
    gain_exceeds_uncertainty = "gain_exceeds_uncertainty"
    """The fastest is more complex and gains more than the bar over every simpler candidate."""
    interval_clears_measurements = "interval_clears_measurements"
    """Trials ran and an untried candidate's whole interval lies below every measurement (the planner's rule)."""


class BarSource(StrEnum):
    floor = "floor"
    interval = "interval"
    measurement_noise = "measurement_noise"


def simplicity_of(strategy: Strategy) -> Simplicity:
    """How simple a strategy is (see the module docstring); only what executes counts."""
    mesh = strategy.effective_mesh
    whole_replicas = (
        mesh.tensor == 1
        and mesh.pipeline == 1
        and mesh.context == 1
        and not strategy.tensor_parallel
        and (strategy.pipeline is None or len(strategy.pipeline.stages) == 1)
        and strategy.consistency.kind == "bsp"
    )
    if whole_replicas and strategy.variables:
        configs = [c for c in strategy.variables if c.partition is None or c.partition.shards == 1]
        if len(configs) == len(strategy.variables):
            syncs = [c.synchronizer for c in configs]
            if all(isinstance(s, AllReduceSynchronizer) and s.compressor.kind == "none" for s in syncs):
                return Simplicity.data_parallel
            if all(isinstance(s, ShardedSynchronizer) for s in syncs):
                return Simplicity.fsdp
    if strategy.provenance.builder in BUILDERS:
        return Simplicity.builder
    return Simplicity.searched


@dataclass(frozen=True)
class Choice:
    """One candidate as the rule sees it."""

    id: str
    label: str
    """How the answer names it (`DataParallel`, `search candidate 3f2a9c1e`)."""
    simplicity: Simplicity
    throughput: float
    """Samples per second on the basis being compared (predicted, or measured)."""
    uncertainty: float | None = None
    """Relative distance to the slowest it plausibly runs ((high − mid) / mid); None without an interval."""


@dataclass(frozen=True)
class Decision:
    rule: Rule
    basis: str
    """`predicted` or `measured`: what the throughputs compared were."""
    chosen: Choice
    fastest: Choice
    bar: float
    bar_source: BarSource
    gain: float | None
    """The fastest's relative throughput gain over the simpler candidate it was weighed against."""
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule.value,
            "basis": self.basis,
            "chosen": self.chosen.id,
            "chosen_label": self.chosen.label,
            "chosen_simplicity": self.chosen.simplicity.name,
            "fastest": self.fastest.id,
            "fastest_label": self.fastest.label,
            "fastest_simplicity": self.fastest.simplicity.name,
            "bar": self.bar,
            "bar_source": self.bar_source.value,
            "gain": self.gain,
            "reason": self.reason,
        }


def decide(
    choices: Sequence[Choice],
    *,
    floor: float = FLOOR,
    floor_source: BarSource = BarSource.floor,
    basis: str = "predicted",
) -> Decision:
    """The simplest choice within the bar of the fastest; raises ValueError when none has a throughput."""
    usable = [c for c in choices if math.isfinite(c.throughput) and c.throughput > 0]
    if not usable:
        raise ValueError("no candidate with a positive throughput to decide between")
    fastest = max(usable, key=lambda c: (c.throughput, -c.simplicity))
    bar, source = floor, floor_source
    if fastest.uncertainty is not None and math.isfinite(fastest.uncertainty) and fastest.uncertainty > floor:
        bar, source = fastest.uncertainty, BarSource.interval
    verb = "measured" if basis == "measured" else "predicted"
    doubt = "the measurements' uncertainty" if basis == "measured" else "the prediction's uncertainty"
    simpler = [c for c in usable if c.simplicity < fastest.simplicity]
    within = [c for c in simpler if _gain(fastest, c) <= bar]
    if within:
        chosen = min(within, key=lambda c: (c.simplicity, -c.throughput))
        gain = _gain(fastest, chosen)
        reason = (
            f"{chosen.label} ({chosen.simplicity.words}) is {verb} within {gain:.1%} of the fastest, "
            f"{fastest.label}; that is inside {doubt} ({_bar_words(bar, source)}), "
            "so the simpler strategy is the answer"
        )
        return Decision(Rule.simpler_within_uncertainty, basis, chosen, fastest, bar, source, gain, reason)
    if simpler:
        rival = max(simpler, key=lambda c: c.throughput)
        gain = _gain(fastest, rival)
        reason = (
            f"{fastest.label} is {verb} {gain:.1%} faster than the best simpler strategy, {rival.label} "
            f"({rival.simplicity.words}); that exceeds {doubt} ({_bar_words(bar, source)}), "
            "so it is the answer"
        )
        return Decision(Rule.gain_exceeds_uncertainty, basis, fastest, fastest, bar, source, gain, reason)
    if fastest.simplicity == Simplicity.data_parallel:
        reason = f"{fastest.label} is the fastest {verb} and already plain data parallel"
    else:
        reason = f"{fastest.label} is the fastest {verb} and no simpler strategy fits"
    return Decision(Rule.fastest_is_simplest, basis, fastest, fastest, bar, source, None, reason)


def _gain(fastest: Choice, other: Choice) -> float:
    return fastest.throughput / other.throughput - 1.0


def _bar_words(bar: float, source: BarSource) -> str:
    return {
        BarSource.floor: f"{bar:.1%}, the stated floor",
        BarSource.interval: f"{bar:.1%}, the learned correction's interval",
        BarSource.measurement_noise: f"{bar:.1%}, their noise",
    }[source]


def predicted_choice(strategy: Strategy, label: str, *, uncertainty: float | None = None) -> Choice | None:
    """A strategy as the rule sees its prediction; None when it has none or does not fit."""
    predicted = strategy.predicted
    if predicted is None or not predicted.feasible or not predicted.samples_per_s > 0:
        return None
    return Choice(str(strategy.id), label, simplicity_of(strategy), predicted.samples_per_s, uncertainty)
