"""Synthetic trial records with a known error in the simulator, for tests and examples.

Nothing here is a measurement. Each synthetic job has a compute time and strategies that split their
communication between all-reduce and a parameter server; the "simulator" is the plain sum, while the
"measured" time scales each part by a known bias (`BIAS`) and adds a little noise. A correction that
works must learn those factors from some jobs and apply them to jobs it has not seen.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from simulator.learned.records import TrainingRecord
from simulator.learned.summaries import ClusterSummary, GraphSummary, StrategySummary

BIAS = {"compute": 1.3, "allreduce": 1.1, "ps": 2.5}
"""Measured = sum of each simulated component times its factor: the simulator underrates PS traffic most."""


def synthetic_records(
    n_groups: int = 12,
    per_group: int = 8,
    *,
    seed: int = 0,
    noise: float = 0.02,
    measured: bool = True,
    bias: Mapping[str, float] = BIAS,
) -> list[TrainingRecord]:
    """`bias` scales each simulated component into the measured time (default `BIAS`)."""
    rng = np.random.default_rng(seed)
    records = []
    for group in range(n_groups):
        params = float(10 ** rng.uniform(6, 9))
        compute = float(rng.uniform(0.05, 0.5))
        bandwidth = float(10 ** rng.uniform(9, 10.5))
        graph = GraphSummary(
            num_parameters=params,
            parameter_bytes=4 * params,
            flops_per_step=6 * params * 32,
            sparse_share=0.0,
            batch_size=32,
            num_layers=24,
            num_variables=100,
        )
        cluster = ClusterSummary(
            num_devices=8,
            num_nodes=2,
            min_bandwidth_bytes_per_s=bandwidth,
            max_bandwidth_bytes_per_s=10 * bandwidth,
            device_code=1,
            peak_flops=8.1e12,
            memory_bandwidth_bytes_per_s=3.2e11,
            device_memory_bytes=16e9,
        )
        for index in range(per_group):
            ps_share = float(rng.uniform(0, 1))
            allreduce = float(rng.uniform(0.0, 0.3)) * (1 - ps_share)
            ps = float(rng.uniform(0.0, 0.5)) * ps_share
            true = bias["compute"] * compute + bias["allreduce"] * allreduce + bias["ps"] * ps
            records.append(
                TrainingRecord(
                    group_id=f"job-{group}",
                    strategy_id=f"job-{group}/strategy-{index}",
                    graph=graph,
                    cluster=cluster,
                    strategy=_strategy(ps_share),
                    simulated_step_time_s=compute + allreduce + ps,
                    breakdown={"compute": compute, "allreduce": allreduce, "ps": ps},
                    measured_step_time_s=true * float(np.exp(rng.normal(0, noise))) if measured else None,
                    source="synthetic",
                )
            )
    return records


def _strategy(ps_share: float) -> StrategySummary:
    return StrategySummary(
        ps_fraction=ps_share,
        allreduce_fraction=1 - ps_share,
        sharded_fraction=0.0,
        compressed_fraction=0.0,
        local_replication_fraction=0.0,
        num_shards=100,
        num_partitioned=0,
        num_groups=1,
        num_ps_servers=2,
        max_server_share=0.5,
        consistency_code=0,
        staleness=0,
        data_degree=8,
        tensor_degree=1,
        pipeline_degree=1,
        micro_batches=1,
    )
