"""The layout descent: from the best layouts found so far, every one-dimension neighbour, until none
of the best is left unexplored.

A beam search over the lattice of layouts (`neighbours.py`): each round takes the best `PARENTS`
distinct layouts of the archive (layout and ZeRO setting; the variables' fine settings aside) that have
not been expanded yet, simulates all their neighbours as one batch, and stops when the best layouts have
all been expanded, or after its share of the budget. Practitioners tune the same way — start from a
known layout, change one knob, keep what helps (NeMo's auto-configurator sweeps a grid around a
heuristic start) — and a layout's neighbours are exactly what its explanation compares it with. Its
rows are labelled as local search's are (`root + local search`); `evaluated_by_phase` counts them apart.
"""

from __future__ import annotations

from optimizer_service.search.assign import respect_mesh
from optimizer_service.search.evaluate import Evaluator
from optimizer_service.search.local_search import SUFFIX
from optimizer_service.search.neighbours import mesh_of_row, neighbour_rows, zero_of_row
from optimizer_service.search.space import Space
from simulator.encoding import CandidateBatch

PARENTS = 8
"""Layouts expanded per round."""
SHARE = 0.4
"""Most of what is left of the budget (candidates or time) the descent may use."""


def descend(space: Space, evaluator: Evaluator, *, share: float = SHARE, parents: int = PARENTS) -> int:
    """Expand the best unexplored layouts until none is left or the share is used; returns the rounds."""
    expanded: set[tuple] = set()
    started = evaluator.fraction_used()
    stop_at = started + share * (1.0 - started)
    rounds = 0
    while not evaluator.exhausted and evaluator.fraction_used() < stop_at:
        archive = evaluator.archive
        if archive is None:
            break
        picked = _unexpanded(space, archive.batch, expanded, parents)
        if not picked:
            break
        batches, labels = [], []
        for i in picked:
            rows, found = neighbour_rows(space, archive.batch, i)
            root = str(archive.labels[i]).removesuffix(SUFFIX)
            batches.append(rows)
            labels += [root + SUFFIX] * len(found)
            expanded.add(layout_key(space, archive.batch, i))
        if batches:
            children = CandidateBatch.concat(*batches)
            respect_mesh(space, children)
            evaluator.evaluate_in_pieces(children, labels, "descent")
        rounds += 1
    return rounds


def layout_key(space: Space, batch: CandidateBatch, i: int) -> tuple:
    """What makes two rows the same layout: the mesh and the ZeRO setting."""
    return mesh_of_row(space, batch, i), zero_of_row(space, batch, i)


def _unexpanded(space: Space, batch: CandidateBatch, expanded: set[tuple], parents: int) -> list[int]:
    """The best archive row of each layout (best first) whose layout has not been expanded yet."""
    seen: set[tuple] = set()
    out: list[int] = []
    for i in range(len(batch)):
        key = layout_key(space, batch, i)
        if key in seen:
            continue
        seen.add(key)
        if key not in expanded:
            out.append(i)
            if len(out) == parents:
                break
    return out
