"""AutoDist's Parallax builder: dense variables all-reduced, sparse ones on load-balanced servers."""

from __future__ import annotations

from dataclasses import dataclass

from stratagem.builders.base import (
    AnySynchronizer,
    Builder,
    check_sync_params,
    consistency_of,
    ps_servers,
    ps_synchronizer,
)
from stratagem.builders.sharding import GreedyLoads
from stratagem.builders.vocabulary import SPEC_TO_ALGORITHM, compressor_for
from stratagem.ir import AllReduceSynchronizer, ModelGraph, ResourceSpec, Strategy, VariableConfig


@dataclass(frozen=True)
class Parallax(Builder):
    """Parallax (arXiv:1808.02621): PS suits sparse gradients, all-reduce suits dense ones.

    As in AutoDist: the fusion group is `index // chunk_size` where the index counts *all*
    trainable variables (sparse ones included), the all-reduce spec is NCCL with no compression,
    and sparse variables never get a local proxy whatever `local_proxy_variable` says (they are
    large and each worker touches few rows, so a proxy copy would cost more than it saves); the
    argument is kept so AutoDist's signature carries over.
    """

    chunk_size: int = 128
    local_proxy_variable: bool = False
    sync: bool = True
    staleness: int = 0

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise self.argument_error("chunk_size", f"must be at least 1, got {self.chunk_size}")
        check_sync_params(self, self.sync, self.staleness)

    def build(self, graph: ModelGraph, resources: ResourceSpec) -> Strategy:
        variables = graph.trainable_variables
        loads = GreedyLoads(ps_servers(resources)) if any(v.sparse for v in variables) else None
        configs = []
        for index, var in enumerate(variables):
            sync: AnySynchronizer
            if var.sparse and loads is not None:
                sync = ps_synchronizer(
                    loads.place(var.nbytes), local_replication=False, sync=self.sync, staleness=self.staleness
                )
            else:
                sync = AllReduceSynchronizer(
                    algorithm=SPEC_TO_ALGORITHM["NCCL"],
                    group=index // self.chunk_size,
                    compressor=compressor_for("NoneCompressor"),
                )
            configs.append(VariableConfig(var_name=var.name, synchronizer=sync))
        return self._strategy(graph, resources, configs, consistency_of(self.sync, self.staleness))
