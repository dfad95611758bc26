"""The runtime: execute a Strategy inside torch.distributed (gloo on CPUs, NCCL on GPUs).

`distribute(model, optimizer, strategy)` returns a model and optimizer that train as usual; one
executor per synchronizer kind (all-reduce, parameter server, ZeRO sharding, with compressors)
does the communication. `init_from_env()` joins a process group started by `stratagem.launch` or
torchrun. See docs/runtime.md.
"""

from stratagem.runtime.context_parallel import context_positions, context_shard
from stratagem.runtime.data import local_batch
from stratagem.runtime.distribute import distribute, load_strategy, replica_device
from stratagem.runtime.launch import DistEnv, init_from_env, launch
from stratagem.runtime.mesh_layout import MeshLayout, context_parallel_rank, data_parallel_rank
from stratagem.runtime.multi_optimizer import MultiOptimizer
from stratagem.runtime.optimizer import DistributedOptimizer
from stratagem.runtime.plan import Plan, resolve_plan
from stratagem.runtime.stats import SyncStats

__all__ = [
    "DistEnv",
    "DistributedOptimizer",
    "MeshLayout",
    "MultiOptimizer",
    "PipelinedModel",
    "Plan",
    "SyncStats",
    "context_parallel_rank",
    "context_positions",
    "context_shard",
    "data_parallel_rank",
    "distribute",
    "init_from_env",
    "launch",
    "load_strategy",
    "local_batch",
    "replica_device",
    "resolve_plan",
]


def __getattr__(name: str) -> object:
    """`PipelinedModel` loads torch.distributed.pipelining (about 1 s), so it is imported on first use."""
    if name == "PipelinedModel":
        from stratagem.runtime.pipeline_parallel import PipelinedModel

        return PipelinedModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
