"""`MultiOptimizer`: several torch optimizers over disjoint parameters, handed to `distribute` as one.

Why it exists: no torch optimizer applies Adam to sparse and dense gradients alike. Recommendation
models (DLRM) train their embedding tables, whose gradients are sparse, with `torch.optim.SparseAdam`
and everything else with `Adam`:

    dense = [p for n, p in model.named_parameters() if not n.startswith("tables.")]
    optimizer = MultiOptimizer([torch.optim.SparseAdam(model.tables.parameters()), torch.optim.Adam(dense)])
    model, optimizer = distribute(model, optimizer, strategy)

Its param groups are its parts' groups, the very same dicts, so learning-rate schedulers and
hyper-parameter changes reach the parts. The runtime updates parameter-server and ZeRO pieces with
clones of the optimizer that owns a piece's param group (`part_of`), so a sparse table served by a
parameter server is stepped by a SparseAdam there, the dense layers by an Adam.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import Any

import torch

from stratagem.errors import StratagemError


def closure_loss(closure: Callable[[], float] | None) -> float | None:
    """`Optimizer.step`'s closure evaluated as torch's own optimizers do (with gradients on, since
    `step` itself runs under `no_grad`)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class MultiOptimizer(torch.optim.Optimizer):
    def __init__(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        parts = list(optimizers)
        _check_parts(parts)
        self._assembled = False
        super().__init__([p for part in parts for group in part.param_groups for p in group["params"]], {})
        self.optimizers = parts
        self.param_groups = [group for part in parts for group in part.param_groups]
        self.state = _JointState(parts)  # type: ignore[assignment]
        self._assembled = True

    def part_of(self, group_index: int) -> torch.optim.Optimizer:
        """The part that owns param group `group_index` of this optimizer."""
        owners = [part for part in self.optimizers for _ in part.param_groups]
        return owners[group_index]

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure_loss(closure)
        for part in self.optimizers:
            part.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.optimizers:
            part.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if getattr(self, "_assembled", False):
            raise StratagemError(
                "MultiOptimizer.add_param_group: add the group to one of its parts "
                "(`.optimizers[i].add_param_group`) so that part steps it"
            )
        super().add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizers": [part.state_dict() for part in self.optimizers]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict.get("optimizers")
        if not isinstance(saved, list) or len(saved) != len(self.optimizers):
            found = len(saved) if isinstance(saved, list) else "no"
            raise StratagemError(
                f"MultiOptimizer.load_state_dict: expected {len(self.optimizers)} optimizers' states, got {found}"
            )
        for part, part_state in zip(self.optimizers, saved, strict=True):
            part.load_state_dict(part_state)

    def __repr__(self) -> str:
        return f"MultiOptimizer({', '.join(type(part).__name__ for part in self.optimizers)})"


def component_optimizers(optimizer: torch.optim.Optimizer) -> list[torch.optim.Optimizer]:
    """The optimizers that actually update parameters: a MultiOptimizer's parts, else the optimizer itself."""
    return list(optimizer.optimizers) if isinstance(optimizer, MultiOptimizer) else [optimizer]


def owning_optimizer(optimizer: torch.optim.Optimizer, group_index: int) -> torch.optim.Optimizer:
    """The optimizer whose class and hyper-parameters apply to param group `group_index`."""
    return optimizer.part_of(group_index) if isinstance(optimizer, MultiOptimizer) else optimizer


def _check_parts(parts: list[torch.optim.Optimizer]) -> None:
    if not parts:
        raise StratagemError("MultiOptimizer needs at least one optimizer")
    seen: dict[int, int] = {}
    for index, part in enumerate(parts):
        if not isinstance(part, torch.optim.Optimizer):
            raise StratagemError(
                f"MultiOptimizer: optimizers[{index}] is a {type(part).__name__}, not a torch optimizer"
            )
        if isinstance(part, MultiOptimizer):
            raise StratagemError(
                f"MultiOptimizer: optimizers[{index}] is itself a MultiOptimizer; pass its parts instead"
            )
        for group in part.param_groups:
            for param in group["params"]:
                if id(param) in seen and seen[id(param)] != index:
                    raise StratagemError(
                        f"MultiOptimizer: a parameter of shape {tuple(param.shape)} is in both "
                        f"optimizers[{seen[id(param)]}] and optimizers[{index}]; each must own its own"
                    )
                seen[id(param)] = index


class _JointState(MutableMapping):
    """The parts' states seen as one, each parameter's entry kept in the part that steps it."""

    def __init__(self, parts: list[torch.optim.Optimizer]) -> None:
        self._parts = parts

    def _owner(self, param: Any) -> torch.optim.Optimizer:
        for part in self._parts:
            if any(p is param for group in part.param_groups for p in group["params"]):
                return part
        raise KeyError(param)

    def __getitem__(self, param: Any) -> Any:
        for part in self._parts:
            if param in part.state:
                return part.state[param]
        return self._owner(param).state[param]

    def __setitem__(self, param: Any, value: Any) -> None:
        self._owner(param).state[param] = value

    def __delitem__(self, param: Any) -> None:
        for part in self._parts:
            if param in part.state:
                del part.state[param]
                return
        raise KeyError(param)

    def __iter__(self) -> Iterator[Any]:
        for part in self._parts:
            yield from part.state

    def __len__(self) -> int:
        return sum(len(part.state) for part in self._parts)
