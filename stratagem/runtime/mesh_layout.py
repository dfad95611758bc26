"""Where each rank sits on a strategy's mesh, and the device mesh and process groups built from it.

The IR nests the degrees data × pipeline × context × tensor, tensor innermost:
`rank = ((d · P + p) · C + c) · T + t` (`stratagem.ir.Mesh`), so a tensor group is T consecutive
replicas (one node), a context group is the C · T block around it, and the ranks that hold the same
parameters are every rank with the same (p, t): D data indices × C context indices. Those are the
ranks the data-parallel synchronizers average over (context ranks train on different tokens of the
same samples, so their gradients are averaged like data-parallel ones), and FSDP2 shards over
shard × context flattened, as torchtitan's `dp_shard_cp`.

The device mesh is (replicate, shard, pipeline, context, tensor): the data-parallel degree D is split
into D/g groups of g consecutive data ranks for hybrid sharding (`shard_group` g; g = D without one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from stratagem.ir import Strategy
from stratagem.runtime.comm import Team
from stratagem.runtime.sharded import ShardTeams

DEVICE_MESH_AXES = ("replicate", "shard", "pipeline", "context", "tensor")


@dataclass(frozen=True)
class MeshLayout:
    """Where each rank sits on the data × pipeline × context × tensor mesh (tensor innermost)."""

    data: int
    pipeline: int
    tensor: int
    context: int = 1

    @classmethod
    def of(cls, strategy: Strategy) -> MeshLayout:
        mesh = strategy.effective_mesh
        return cls(mesh.data, mesh.pipeline, mesh.tensor, mesh.context)

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """(data index, stage, tensor index) of `rank`; its context index is `context_index`."""
        d, rest = divmod(rank, self.pipeline * self.context * self.tensor)
        p, rest = divmod(rest, self.context * self.tensor)
        return d, p, rest % self.tensor

    def context_index(self, rank: int) -> int:
        """Which piece of its samples' sequences `rank` holds (0 ≤ c < context)."""
        return (rank // self.tensor) % self.context

    def rank_of(self, d: int, p: int, c: int, t: int) -> int:
        return ((d * self.pipeline + p) * self.context + c) * self.tensor + t

    def data_group(self, rank: int) -> list[int]:
        """The ranks holding the same stage and tensor shard as `rank` (its parameters' replicas), in
        (data, context) order."""
        _, p, t = self.coordinates(rank)
        return [self.rank_of(d, p, c, t) for d in range(self.data) for c in range(self.context)]


def data_parallel_rank(strategy: Strategy, rank: int) -> tuple[int, int]:
    """(index, size) of `rank`'s data-parallel group: which slice of the global batch it trains on.

    The ranks of one tensor group, of one pipeline and of one context group feed the same slice (a
    context rank then keeps its piece of each sequence: `context_shard`).
    """
    layout = MeshLayout.of(strategy)
    return layout.coordinates(rank)[0], layout.data


def context_parallel_rank(strategy: Strategy, rank: int) -> tuple[int, int]:
    """(index, size) of `rank` in its context group: which piece of every sequence it holds."""
    layout = MeshLayout.of(strategy)
    return layout.context_index(rank), layout.context


@dataclass
class DeviceMeshes:
    """The device mesh and the sub-meshes the hybrid runtime hands to each piece."""

    mesh: Any
    data: Any
    """Replicate × shard × context flattened: the synchronizers' group."""
    shard: Any
    """Shard × context flattened: a hybrid shard group."""
    fsdp: Any
    """FSDP2's mesh: shard × context (1-D), or replicate × (shard × context) for hybrid sharding."""


def device_meshes(device: torch.device, layout: MeshLayout, group_size: int) -> DeviceMeshes:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(
        device.type,
        (layout.data // group_size, group_size, layout.pipeline, layout.context, layout.tensor),
        mesh_dim_names=DEVICE_MESH_AXES,
    )
    sizes = {"replicate": layout.data // group_size, "shard": group_size, "context": layout.context}
    present = [name for name, size in sizes.items() if size > 1]
    if not present:
        data = mesh["shard"]
    elif len(present) == 1:
        data = mesh[present[0]]
    else:
        data = mesh[tuple(present)]._flatten("data")
    if layout.context == 1:
        shard, shard_name = mesh["shard"], "shard"
    elif group_size == 1:
        shard, shard_name = mesh["context"], "context"
    else:
        shard, shard_name = mesh["shard", "context"]._flatten("shard_context"), "shard_context"
    fsdp = mesh["replicate", shard_name] if group_size < layout.data else shard
    return DeviceMeshes(mesh, data, shard, fsdp)


def shard_teams(meshes: DeviceMeshes, layout: MeshLayout, rank: int, group_size: int) -> ShardTeams:
    """This rank's hybrid shard group (g data ranks × the context group) and replicate group, as teams of
    the synchronizers' group ranks (index d · C + c)."""
    d, _, _ = layout.coordinates(rank)
    c, width = layout.context_index(rank), layout.context
    members = layout.data_group(rank)
    start = (d - d % group_size) * width
    shard = list(range(start, start + group_size * width))
    replicate = [(r * group_size + d % group_size) * width + c for r in range(layout.data // group_size)]
    return ShardTeams(
        shard=Team(shard, [members[i] for i in shard], meshes.shard.get_group()),
        replicate=Team(replicate, [members[i] for i in replicate], meshes.mesh["replicate"].get_group()),
    )
