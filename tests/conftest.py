"""Shared fixtures: small hand-built graphs and clusters every part of the test suite can reuse.

Graphs (FLOPs and bytes are worked out from the shapes at the stated batch size, so simulator tests
can reason about them):
- `mlp_graph`: a dense 3-layer MLP, 6 variables, float32.
- `embedding_graph`: a recommendation-style model with one large sparse embedding table, a dense
  MLP on top and one frozen (non-trainable) variable.
- `awkward_graph`: variables whose dim 0 is 7 (prime), 64 (a power of two), 6, 9, 1 and a scalar,
  for partitioning rules; plus a float16 variable and a frozen one.

Clusters:
- `cpu_1x2`: one node (loopback) training on 2 CPUs.
- `t4_2x4`: 2 nodes x 4 T4 GPUs, 50 Gbit/s between nodes (AWS g4dn.12xlarge, as in AutoDist's benchmarks).
- `t4_16x4`: 16 such nodes.

Trials: `trial_setup` is a small MLP, two CPU ranks and DataParallel's strategy; `ray_backend` a real
local Ray of 2 CPUs, started once per test module that asks for it.

The `make_*` functions in `sample_documents` build the same documents at other sizes
(`from sample_documents import make_mlp_graph`).

Fixtures of the service (an app on a fresh SQLite file or PostgreSQL database) are in
`service_fixtures.py`, loaded here as a plugin so every test module can ask for them. Plain helpers
live in modules without tests, imported by name: `service_helpers`, `dashboard_helpers`,
`cli_helpers`, `search_graphs`, `runtime_helpers`. Test modules never import each other.

Records cut from real measurements live in `tests/data/` (see its README).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sample_documents import (
    make_awkward_graph,
    make_cpu_cluster,
    make_embedding_graph,
    make_mlp_graph,
    make_t4_cluster,
)

from stratagem.builders import DataParallel
from stratagem.ir import ModelGraph, ResourceSpec, Strategy

try:
    import fastapi  # noqa: F401
except ImportError:  # a GPU machine running the CUDA tests alone (benchmarks/gpu_check.sh) lacks the service
    pytest_plugins: list[str] = []
else:
    pytest_plugins = ["service_fixtures"]


@pytest.fixture
def mlp_graph() -> ModelGraph:
    return make_mlp_graph()


@pytest.fixture
def embedding_graph() -> ModelGraph:
    return make_embedding_graph()


@pytest.fixture
def awkward_graph() -> ModelGraph:
    return make_awkward_graph()


@pytest.fixture
def cpu_1x2() -> ResourceSpec:
    return make_cpu_cluster(2)


@pytest.fixture
def t4_2x4() -> ResourceSpec:
    return make_t4_cluster(2)


@pytest.fixture
def t4_16x4() -> ResourceSpec:
    return make_t4_cluster(16)


@pytest.fixture(params=["mlp", "embedding", "awkward"])
def any_graph(request: pytest.FixtureRequest) -> ModelGraph:
    """Each shared graph in turn."""
    return {"mlp": make_mlp_graph, "embedding": make_embedding_graph, "awkward": make_awkward_graph}[request.param]()


@pytest.fixture(params=["cpu_1x2", "t4_2x4", "t4_16x4"])
def any_cluster(request: pytest.FixtureRequest) -> ResourceSpec:
    """Each shared cluster in turn."""
    return {
        "cpu_1x2": lambda: make_cpu_cluster(2),
        "t4_2x4": lambda: make_t4_cluster(2),
        "t4_16x4": lambda: make_t4_cluster(16),
    }[request.param]()


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A one-rank gloo process group in this process: the runtime's collectives become trivial."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def trial_setup() -> tuple[ModelGraph, ResourceSpec, Strategy]:
    graph = make_mlp_graph(batch_size=8, widths=(64, 64, 10))
    resources = make_cpu_cluster(2)
    return graph, resources, DataParallel().build(graph, resources)


@pytest.fixture(scope="module")
def ray_backend() -> Iterator[tuple[Any, Any]]:
    """A real local Ray of 2 CPUs for the module's trials, and the `ray` module; skipped without Ray."""
    ray = pytest.importorskip("ray")
    from trial_runner import RayBackend

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_AUTH_MODE", "disabled")
        with RayBackend(init_kwargs={"num_cpus": 2}) as backend:
            yield backend, ray
