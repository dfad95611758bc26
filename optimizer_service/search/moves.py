"""Local moves: small edits of candidate rows, applied to many rows at once.

Each move picks one variable (or group) per row and changes one thing about it, keeping the row
inside the space (`space.py`): a sparse variable stays on parameter servers, shards stay within the
room kept for them, compression and consistency change only when the caller allowed them. Moves are
vectorized over rows: `mutate` draws a move per row and applies each kind of move to all the rows
that drew it in one numpy pass, so a batch of thousands of children costs milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from optimizer_service.search.assign import (
    respect_mesh,
    round_robin_servers,
    server_traffic,
    set_allreduce,
    set_mesh,
    set_ps_pairs,
    set_sharded,
)
from optimizer_service.search.neighbours import DIMENSIONS, apply, changes
from optimizer_service.search.proposals import variable_classes
from optimizer_service.search.space import Space
from simulator.encoding import Algorithm, CandidateBatch, CompressorKind, SyncKind


class Loads:
    """Parameter-server traffic per row ([rows of the batch, S] bytes), as of the start of `mutate`.

    Moves use it to pick the idlest server. It is computed once (or handed over from the parents,
    whose children start as their copies), so a row's second and third move read loads that are one
    or two moves stale: a heuristic for where to put a shard, not a prediction.
    """

    def __init__(self, space: Space, batch: CandidateBatch, traffic: np.ndarray | None = None) -> None:
        self.space, self.batch = space, batch
        self._traffic = traffic

    def of(self, rows: np.ndarray) -> np.ndarray:
        if self._traffic is None:
            self._traffic = server_traffic(self.space, self.batch, np.arange(len(self.batch)))
        return self._traffic[rows]


Move = Callable[[Space, CandidateBatch, np.ndarray, np.random.Generator, Loads], None]


def mutate(
    space: Space,
    batch: CandidateBatch,
    rng: np.random.Generator,
    *,
    max_moves: int = 3,
    traffic: np.ndarray | None = None,
) -> None:
    """Apply 1..max_moves random moves to every row of `batch`, in place.

    `traffic` ([N, S], optional) is each row's server traffic if the caller knows it. Each move
    function receives distinct, sorted row indices (a move edits a row at most once per pass).
    """
    loads = Loads(space, batch, traffic)
    moves = available_moves(space)
    names = list(moves)
    weights = np.array([MOVE_WEIGHTS[name] for name in names], dtype=np.float64)
    count = 1 + np.minimum(rng.geometric(0.55, size=len(batch)) - 1, max_moves - 1)
    for step in range(max_moves):
        active = np.flatnonzero(count > step)
        if len(active) == 0:
            break
        drawn = _draw(rng, weights[None, :] * _applicable(space, batch, active, names))
        for index, name in enumerate(names):
            rows = active[drawn == index]
            if len(rows):
                moves[name](space, batch, rows, rng, loads)
    respect_mesh(space, batch)


def _applicable(space: Space, batch: CandidateBatch, rows: np.ndarray, names: list[str]) -> np.ndarray:
    """[len(rows), moves] whether a move can change the row (a row with no PS variable has no shard to move)."""
    kinds = batch.kind[rows]
    ps = (kinds == SyncKind.PS).any(axis=1)
    allreduce = (kinds == SyncKind.ALLREDUCE).any(axis=1)
    fused = ((kinds == SyncKind.ALLREDUCE) | (kinds == SyncKind.SHARDED)).sum(axis=1) >= 2
    always = np.ones(len(rows), dtype=bool)
    by_move = {
        "switch_synchronizer": always & bool((~space.context.var_sparse).any()),
        "move_shard": ps & (space.num_servers > 1),
        "resplit": ps & bool((space.shard_limit > 1).any()),
        "merge_groups": fused,
        "split_group": fused,
        "change_algorithm": allreduce,
        "change_compressor": allreduce,
        "partition_allreduce": allreduce,
        "toggle_replication": ps,
    }
    return np.stack([by_move.get(name, always) for name in names], axis=1)


def _draw(rng: np.random.Generator, weights: np.ndarray) -> np.ndarray:
    """One column per row, with probability proportional to that row's weights (-1 where all are 0)."""
    cumulative = np.cumsum(weights, axis=1)
    total = cumulative[:, -1:]
    picked = (cumulative < rng.random((len(weights), 1)) * total).sum(axis=1)
    return np.where(total[:, 0] > 0, np.minimum(picked, weights.shape[1] - 1), -1)


MOVE_WEIGHTS = {
    "switch_synchronizer": 3.0,
    "move_shard": 3.0,
    "resplit": 1.5,
    "merge_groups": 2.0,
    "split_group": 2.0,
    "change_algorithm": 1.5,
    "toggle_replication": 1.0,
    "block_switch": 1.0,
    "change_compressor": 1.5,
    "change_consistency": 0.5,
    "partition_allreduce": 0.5,
    "change_mesh": 1.5,
    "change_dimension": 1.5,
}


ENGINE_MOVES = ("merge_groups", "split_group", "change_algorithm", "change_mesh", "change_dimension")
"""For an engine every dense variable synchronizes alike (`assign.respect_mesh`): per-variable moves would
be undone, so only fusion buckets, algorithms and the layout move."""


def available_moves(space: Space) -> dict[str, Move]:
    moves = _moves(space)
    if space.rules.runner == "engine":
        return {name: move for name, move in moves.items() if name in ENGINE_MOVES}
    return moves


def _moves(space: Space) -> dict[str, Move]:
    moves: dict[str, Move] = {
        "switch_synchronizer": switch_synchronizer,
        "move_shard": move_shard,
        "resplit": resplit,
        "merge_groups": merge_groups,
        "split_group": split_group,
        "change_algorithm": change_algorithm,
        "block_switch": block_switch,
        "partition_allreduce": partition_allreduce,
    }
    if space.local_replication_useful:
        moves["toggle_replication"] = toggle_replication
    if len(space.compressions) > 1:
        moves["change_compressor"] = change_compressor
    if len(space.consistencies) > 1:
        moves["change_consistency"] = change_consistency
    if space.first_meshes > 1:
        moves["change_mesh"] = change_mesh
    moves["change_dimension"] = change_dimension
    return moves


# --- the moves -------------------------------------------------------------------------------------


def switch_synchronizer(
    space: Space, batch: CandidateBatch, rows: np.ndarray, rng: np.random.Generator, loads: Loads
) -> None:
    """One dense variable to another synchronizer; it joins its backward neighbour's fusion group."""
    dense = np.broadcast_to(~space.context.var_sparse, (len(rows), space.num_variables))
    rows, v = _pick_variable(rng, rows, dense)
    if len(rows) == 0:
        return
    current = batch.kind[rows, v]
    target = (current + rng.integers(1, 3, size=len(rows))) % 3
    for kind in SyncKind:
        hit = target == kind
        if hit.any():
            _switch(space, batch, rows[hit], v[hit], kind, rng, loads)


def move_shard(space: Space, batch: CandidateBatch, rows: np.ndarray, rng: np.random.Generator, loads: Loads) -> None:
    """Half the rows: a shard from the busiest server to the idlest; the others: a random shard anywhere."""
    if space.num_servers < 2:
        return
    guided = rng.random(len(rows)) < 0.5
    _move_from_busiest(space, batch, rows[guided], rng, loads)
    rows, v = _pick_variable(rng, rows[~guided], batch.kind[rows[~guided]] == SyncKind.PS)
    if len(rows) == 0:
        return
    k = (rng.random(len(rows)) * batch.shards[rows, v]).astype(np.int64)
    batch.server[rows, v, k] = space.servers[rng.integers(space.num_servers, size=len(rows))]


def resplit(space: Space, batch: CandidateBatch, rows: np.ndarray, rng: np.random.Generator, loads: Loads) -> None:
    """A parameter-server variable into another number of shards, dealt from the idlest server."""
    eligible = (batch.kind[rows] == SyncKind.PS) & (space.shard_limit[None, :] > 1)
    rows, v = _pick_variable(rng, rows, eligible)
    if len(rows) == 0:
        return
    limit = space.shard_limit[v]
    shards = 1 + (rng.random(len(rows)) * limit).astype(np.int64)
    shards = np.where(shards == batch.shards[rows, v], shards % limit + 1, shards)
    _place_ps(space, batch, rows, _one_hot(v, space.num_variables), shards[:, None], loads)


def merge_groups(space: Space, batch: CandidateBatch, rows: np.ndarray, rng: np.random.Generator, loads: Loads) -> None:
    """A fusion group absorbs the next group of the same kind (by label, i.e. later in backward), or
    the last group joins the one before it."""
    rows, v = _pick_variable(rng, rows, _fused(batch, rows))
    if len(rows) == 0:
        return
    groups = batch.group[rows]
    same_kind = batch.kind[rows] == batch.kind[rows, v][:, None]
    label = batch.group[rows, v][:, None]
    following = np.where(same_kind & (groups > label), groups, space.num_variables).min(axis=1, keepdims=True)
    preceding = np.where(same_kind & (groups < label), groups, -1).max(axis=1, keepdims=True)
    last = following == space.num_variables
    keep = np.where(last, preceding, label)
    absorb = np.where(last, label, following)
    batch.group[rows] = np.where(same_kind & (groups == absorb) & (keep >= 0), keep, groups)


def split_group(space: Space, batch: CandidateBatch, rows: np.ndarray, rng: np.random.Generator, loads: Loads) -> None:
    """A fusion group is cut before one of its members (in backward order); the rest get a fresh label."""
    fused = _fused(batch, rows)
    groups = batch.group[rows]
    rank = space.ready_rank[None, :]
    first = _group_min(groups, np.where(fused, rank, np.iinfo(np.int64).max), fused, space.num_variables)
    kinds = batch.kind[rows]
    eligible = fused & (rank > first)
    keep = eligible.any(axis=1)
    rows, v = _pick_variable(rng, rows, eligible)
    if len(rows) == 0:
        return
    sub = np.flatnonzero(keep)
    label = groups[sub, v][:, None]
    kind = kinds[sub, v][:, None]
    moving = (groups[sub] == label) & (kinds[sub] == kind) & fused[sub] & (rank >= space.ready_rank[v][:, None])
    fresh = _unused_label(np.where(fused[sub], groups[sub], -1), space.num_variables)
    batch.group[rows] = np.where(moving, fresh[:, None], groups[sub])


def change_algorithm(
    space: Space, batch: CandidateBatch, rows: np.ndarray, rng: np.random.Generator, loads: Loads
) -> None:
    """Every member of one all-reduce group to another algorithm (a group runs one algorithm)."""
    members, rows, v = _group_of_random_member(batch, rows, rng, SyncKind.ALLREDUCE)
    if len(rows) == 0:
        return
    current = batch.algorithm[rows, v].astype(np.int64)
    target = ((current + rng.integers(1, len(Algorithm), size=len(rows))) % len(Algorithm))[:, None]
    batch.algorithm[rows] = np.where(members, target, batch.algorithm[rows])


def partition_allreduce(
    space: Space, batch: CandidateBatch, rows: np.ndarray, rng: np.random.Generator, loads: Loads
) -> None:
    """An all-reduced variable split along a random axis into another number of shards, 1 to 8
    (PartitionedAR's knob)."""
    splittable = np.any(space.context.var_shape > 1, axis=1)
    rows, v = _pick_variable(rng, rows, (batch.kind[rows] == SyncKind.ALLREDUCE) & splittable[None, :])
    if len(rows) == 0:
        return
    lengths = np.minimum(space.context.var_shape[v], space.max_allreduce_shards)
    axis = np.argmax(np.where(lengths > 1, rng.random(lengths.shape), -1.0), axis=1)
    limit = lengths[np.arange(len(rows)), axis]
    current = np.where(batch.partition_axis[rows, v] == axis, batch.shards[rows, v], 1)
    batch.partition_axis[rows, v] = axis
    batch.shards[rows, v] = (current - 1 + rng.integers(1, limit)) % limit + 1


def change_compressor(
    space: Space, batch: CandidateBatch, rows: np.ndarray, rng: np.random.Generator, loads: Loads
) -> None:
    """Every member of one all-reduce group to another compressor (where it shrinks that member)."""
    members, rows, _ = _group_of_random_member(batch, rows, rng, SyncKind.ALLREDUCE)
    if len(rows) == 0:
        return
    choice = rng.integers(len(space.compressions), size=len(rows))
    for index, compression in enumerate(space.compressions):
        hit = choice == index
        if not hit.any():
            continue
        allowed = space.compression_allowed[index]
        change = members[hit]
        r = rows[hit]
        batch.compressor[r] = np.where(
            change, np.where(allowed, int(compression.kind), int(CompressorKind.NONE)), batch.compressor[r]
        )
        batch.compressor_param[r] = np.where(
            change, np.where(allowed, compression.param, 0.0), batch.compressor_param[r]
        )


def toggle_replication(
    space: Space, batch: CandidateBatch, rows: np.ndarray, rng: np.random.Generator, loads: Loads
) -> None:
    """Local replication on or off: for one PS variable, or for every PS variable of the row."""
    ps = batch.kind[rows] == SyncKind.PS
    everything = rng.random(len(rows)) < 0.5
    whole = rows[everything]
    if len(whole):
        flip = ~batch.local_replication[whole].any(axis=1, keepdims=True)
        batch.local_replication[whole] = np.where(ps[everything], flip, batch.local_replication[whole])
    one, v = _pick_variable(rng, rows[~everything], ps[~everything])
    batch.local_replication[one, v] = ~batch.local_replication[one, v]


def change_consistency(
    space: Space, batch: CandidateBatch, rows: np.ndarray, rng: np.random.Generator, loads: Loads
) -> None:
    pick = rng.integers(len(space.consistencies), size=len(rows))
    batch.consistency[rows] = [int(space.consistencies[i].kind) for i in pick]
    batch.staleness[rows] = [space.consistencies[i].staleness for i in pick]


def change_mesh(space: Space, batch: CandidateBatch, rows: np.ndarray, rng: np.random.Generator, loads: Loads) -> None:
    """Another of the layouts the space starts from: half the rows keep their tensor degree (a new
    pipeline depth, stage split or micro-batch count), the others take any of them."""
    meshes = space.meshes[: space.first_meshes]
    tensors = np.array([m.tensor for m in meshes])
    choice = rng.integers(len(meshes), size=len(rows))
    keep = rng.random(len(rows)) < 0.5
    for i in np.flatnonzero(keep).tolist():
        same = np.flatnonzero(tensors == batch.tensor[rows[i]])
        if same.size:
            choice[i] = same[rng.integers(same.size)]
    set_mesh(space, batch, rows, choice)


def change_dimension(
    space: Space, batch: CandidateBatch, rows: np.ndarray, rng: np.random.Generator, loads: Loads
) -> None:
    """One dimension of the row's layout (a degree, the micro-batch, the schedule, recomputation,
    sequence or async tensor parallelism, compile, precision, the ZeRO stage, shard group or fp8
    all-gathers) to a neighbouring value (`neighbours.py`), the rest kept."""
    picks = rng.permuted(np.tile(np.arange(len(DIMENSIONS)), (len(rows), 1)), axis=1)
    for row, order in zip(rows.tolist(), picks, strict=True):
        for pick in order.tolist():
            found = changes(space, batch, row, DIMENSIONS[pick])
            if found:
                apply(space, batch, np.array([row]), found[int(rng.integers(len(found)))])
                break


def block_switch(space: Space, batch: CandidateBatch, rows: np.ndarray, rng: np.random.Generator, loads: Loads) -> None:
    """Every dense variable of one class (size × position) to one synchronizer: a long jump."""
    classes = variable_classes(space)
    dense = ~space.context.var_sparse
    present = np.unique(classes[dense])
    if len(present) == 0:
        return
    chosen = present[rng.integers(len(present), size=len(rows))]
    target = rng.integers(3, size=len(rows))
    mask = (classes[None, :] == chosen[:, None]) & dense[None, :]
    for kind in SyncKind:
        hit = target == kind
        r = rows[hit]
        if len(r) == 0:
            continue
        if kind == SyncKind.ALLREDUCE:
            set_allreduce(batch, r, mask[hit])
            _label_block(space, batch, r, mask[hit])
        elif kind == SyncKind.SHARDED:
            set_sharded(batch, r, mask[hit])
            _label_block(space, batch, r, mask[hit])
        else:
            partitioned = rng.random(len(r))[:, None] < 0.5
            _place_ps(space, batch, r, mask[hit], np.where(partitioned, space.shard_limit[None, :], 1), loads)


# --- helpers ---------------------------------------------------------------------------------------


def _switch(
    space: Space,
    batch: CandidateBatch,
    rows: np.ndarray,
    v: np.ndarray,
    kind: SyncKind,
    rng: np.random.Generator,
    loads: Loads,
) -> None:
    one_hot = _one_hot(v, space.num_variables)
    if kind == SyncKind.PS:
        shards = np.where(rng.random(len(rows)) < 0.5, space.shard_limit[v], 1)
        _place_ps(space, batch, rows, one_hot, shards[:, None], loads)
        return
    neighbour = _neighbour(space, batch, rows, v, kind)
    if kind == SyncKind.ALLREDUCE:
        set_allreduce(batch, rows, one_hot, algorithm=_neighbour_algorithm(batch, rows, v, neighbour))
    else:
        set_sharded(batch, rows, one_hot)
    join = (neighbour >= 0) & (rng.random(len(rows)) < 0.75)
    fresh = _unused_label(_fusion_labels(batch, rows), space.num_variables)
    batch.group[rows, v] = np.where(join, batch.group[rows, np.maximum(neighbour, 0)], fresh)


def _neighbour(space: Space, batch: CandidateBatch, rows: np.ndarray, v: np.ndarray, kind: SyncKind) -> np.ndarray:
    """The variable of `kind` that became ready just before v in backward (-1 if none)."""
    order = space.backward_order
    members = batch.kind[rows][:, order] == kind
    before = np.arange(space.num_variables)[None, :] < space.ready_rank[v][:, None]
    candidates = members & before
    last = space.num_variables - 1 - np.argmax(candidates[:, ::-1], axis=1)
    return np.where(candidates.any(axis=1), order[last], -1)


def _neighbour_algorithm(batch: CandidateBatch, rows: np.ndarray, v: np.ndarray, neighbour: np.ndarray) -> np.ndarray:
    """[len(rows), V]: at v, the neighbour's algorithm (AUTO without one), so a joined group stays uniform."""
    per_row = np.zeros((len(rows), batch.algorithm.shape[1]), dtype=batch.algorithm.dtype)
    per_row[np.arange(len(rows)), v] = np.where(
        neighbour >= 0, batch.algorithm[rows, np.maximum(neighbour, 0)], Algorithm.AUTO
    )
    return per_row


def _place_ps(
    space: Space, batch: CandidateBatch, rows: np.ndarray, mask: np.ndarray, shards: np.ndarray, loads: Loads
) -> None:
    """Masked variables of each row onto parameter servers, their shards dealt round-robin from the
    row's idlest server; the row keeps its local-replication habit."""
    idlest = np.argmin(loads.of(rows), axis=1)
    shards = np.where(mask, np.minimum(np.broadcast_to(shards, mask.shape), batch.max_shards), 0)
    dealt = np.cumsum(shards, axis=1) - shards
    r, v = np.nonzero(mask)
    servers = round_robin_servers(space, shards[r, v], idlest[r] + dealt[r, v])
    replicate = batch.local_replication[rows].any(axis=1)[r]
    set_ps_pairs(batch, rows[r], v, servers, local_replication=replicate)


def _move_from_busiest(
    space: Space, batch: CandidateBatch, rows: np.ndarray, rng: np.random.Generator, loads: Loads
) -> None:
    if len(rows) == 0:
        return
    traffic = loads.of(rows)
    busiest = space.servers[np.argmax(traffic, axis=1)]
    idlest = space.servers[np.argmin(traffic, axis=1)]
    on_busiest = batch.server[rows] == busiest[:, None, None]
    eligible = (batch.kind[rows] == SyncKind.PS) & on_busiest.any(axis=2)
    keep = eligible.any(axis=1)
    picked, v = _pick_variable(rng, rows, eligible)
    if len(picked) == 0:
        return
    k = np.argmax(batch.server[picked, v] == busiest[keep][:, None], axis=1)
    batch.server[picked, v, k] = idlest[keep]


def _label_block(space: Space, batch: CandidateBatch, rows: np.ndarray, mask: np.ndarray) -> None:
    """A freshly switched block becomes one fusion group of its own."""
    label = _unused_label(np.where(mask, -1, _fusion_labels(batch, rows)), space.num_variables)
    batch.group[rows] = np.where(mask, label[:, None], batch.group[rows])


def _pick_variable(rng: np.random.Generator, rows: np.ndarray, eligible: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One eligible variable per row, uniformly; rows with none are dropped."""
    if len(rows) == 0:
        return rows, np.zeros(0, dtype=np.int64)
    keys = np.where(eligible, rng.random(eligible.shape), -1.0)
    v = np.argmax(keys, axis=1)
    ok = eligible[np.arange(len(rows)), v]
    return rows[ok], v[ok]


def _fused(batch: CandidateBatch, rows: np.ndarray) -> np.ndarray:
    kinds = batch.kind[rows]
    return (kinds == SyncKind.ALLREDUCE) | (kinds == SyncKind.SHARDED)


def _fusion_labels(batch: CandidateBatch, rows: np.ndarray) -> np.ndarray:
    """Fusion labels of the rows, -1 for PS variables (their labels mean nothing and may be reused)."""
    return np.where(batch.kind[rows] == SyncKind.PS, -1, batch.group[rows])


def _group_of_random_member(
    batch: CandidateBatch, rows: np.ndarray, rng: np.random.Generator, kind: SyncKind
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    picked, v = _pick_variable(rng, rows, batch.kind[rows] == kind)
    label = batch.group[picked, v][:, None]
    members = (batch.group[picked] == label) & (batch.kind[picked] == kind)
    return members, picked, v


def _group_min(groups: np.ndarray, values: np.ndarray, member: np.ndarray, size: int) -> np.ndarray:
    """For each (row, v): the minimum of `values` over the members of v's group in that row."""
    n = groups.shape[0]
    flat = (np.arange(n)[:, None] * size + groups).ravel()
    best = np.full(n * size, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(best, flat[member.ravel()], values.ravel()[member.ravel()])
    return best[flat].reshape(groups.shape)


def _unused_label(groups: np.ndarray, size: int) -> np.ndarray:
    """Per row, the smallest label in [0, size) no variable of the row uses (labels of -1 are ignored)."""
    n = groups.shape[0]
    used = np.zeros((n, size + 1), dtype=bool)
    rows = np.repeat(np.arange(n), groups.shape[1])
    labels = groups.ravel()
    valid = labels >= 0
    used[rows[valid], labels[valid]] = True
    return np.argmin(used, axis=1).clip(max=size - 1)


def _one_hot(v: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros((len(v), size), dtype=bool)
    out[np.arange(len(v)), v] = True
    return out
