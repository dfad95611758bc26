"""Compile a (graph, cluster) pair once into arrays, so each candidate costs numpy work, not Python.

`SimContext` is one object with everything the engine needs, indexed the way `simulator.encoding`
documents. Its fields come from three tables, one per thing they index:

- `simulator.devices.DeviceArrays`: devices `d` (`resources.all_devices`), nodes `j`, device kinds `k`;
- `simulator.variables.VariableArrays`: trainable variables `v` (graph order);
- `simulator.layers.LayerArrays`: layers `l` (forward order).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from simulator.devices import DeviceArrays, UpdateKernels, device_arrays, kinds_of
from simulator.layers import LayerArrays, layer_arrays
from simulator.variables import VariableArrays, variable_arrays
from stratagem.ir import ModelGraph, ResourceSpec, TensorParallelLayer
from stratagem.tensor_plan import tensor_plan


@dataclass(frozen=True)
class SimContext(DeviceArrays, VariableArrays, LayerArrays):
    """A compiled (graph, resources) pair. Build it with `compile_context`; never mutate it."""

    graph: ModelGraph
    resources: ResourceSpec
    batch_size: int
    state_bytes_per_param: float
    _layer_time_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = field(
        default_factory=dict, repr=False, compare=False
    )
    _tiles: dict[tuple[str, int], np.ndarray] = field(default_factory=dict, repr=False, compare=False)
    _tensor_plans: dict[int, list[TensorParallelLayer]] = field(default_factory=dict, repr=False, compare=False)
    _activations: dict[Any, tuple[np.ndarray, float]] = field(default_factory=dict, repr=False, compare=False)
    _steps: dict[int, SimContext] = field(default_factory=dict, repr=False, compare=False)
    """Contexts of this graph scaled to other replica steps (`simulator.step_graph.step_context`)."""

    def tensor_plan(self, degree: int) -> list[TensorParallelLayer]:
        """The splits this simulator assumes for a tensor degree, as a Strategy names them (cached)."""
        plan = self._tensor_plans.get(degree)
        if plan is None:
            plan = self._tensor_plans[degree] = tensor_plan(self.graph, self.layer_tp_allreduce.tolist(), degree)
        return list(plan)

    def ready_position_tile(self, n: int) -> np.ndarray:
        """`ready_position` repeated for n candidates, flat [n·V] (cached; do not modify)."""
        return self._tile("ready_position", n)

    def var_bytes_tile(self, n: int) -> np.ndarray:
        """`var_bytes` repeated for n candidates, flat [n·V] (cached; copy before modifying)."""
        return self._tile("var_bytes", n)

    def _tile(self, name: str, n: int) -> np.ndarray:
        tile = self._tiles.get((name, n))
        if tile is None:
            tile = np.tile(getattr(self, name), n)
            tile.flags.writeable = False
            if len(self._tiles) > 16:
                self._tiles.clear()
            self._tiles[(name, n)] = tile
        return tile


def compile_context(graph: ModelGraph, resources: ResourceSpec) -> SimContext:
    """Everything per-graph and per-cluster, computed once; candidates then cost only array work."""
    layers = layer_arrays(graph)
    update = UpdateKernels.of(graph.optimizer, sparse=any(v.sparse for v in graph.variables))
    kinds, device_kind = kinds_of(resources, graph.dtype.value, update)
    variables = variable_arrays(graph, layers.layer_index, kinds)
    devices = device_arrays(resources, kinds, device_kind, total_flops=layers.fwd_flops.sum() + layers.bwd_flops.sum())
    return SimContext(
        graph=graph,
        resources=resources,
        batch_size=graph.batch_size,
        state_bytes_per_param=graph.optimizer.state_bytes_per_param,
        **_fields_of(devices),
        **_fields_of(variables),
        **_fields_of(layers),
    )


def _fields_of(table: DeviceArrays | VariableArrays | LayerArrays) -> dict[str, Any]:
    return {f.name: getattr(table, f.name) for f in fields(table)}
