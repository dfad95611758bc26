"""Replay an OperatorTrace: the recorded forward ops, in order, on real tensors of the recorded shapes.

The forward ops run through the dispatcher with autograd on, exactly as the model's own code ran them,
so autograd records the same backward: `loss.backward()` runs the trace's backward ops in the same
order, each parameter's gradient is accumulated (and its hooks fire) when the real model's would be,
and every activation autograd saves is held until its backward node runs, as in the real step. Tensors
the step does not save are dropped right after their last reader, as Python drops the model's own
temporaries.

Ops that cannot run here (a namespace the worker has not loaded, a kernel this device lacks, an
argument the trace could not write) run as a FLOP burn with outputs of the recorded shapes instead,
and are named in `notes`. The batch is random with the recorded shapes, with values every op
reading it accepts (`trial_runner.replay_inputs`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from stratagem.errors import InvalidGraphError, Problem
from stratagem.tracing.optrace import OperatorTrace, TraceOp, TraceTensor, tensor_refs
from trial_runner.replay_inputs import DTYPES, input_bounds, make_tensor, torch_dtype

_LAYOUTS = {"strided": torch.strided, "sparse_coo": torch.sparse_coo, "sparse_csr": torch.sparse_csr}
_MEMORY_FORMATS = {
    "contiguous_format": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d,
    "preserve_format": torch.preserve_format,
}
_RECOVERABLE = ("could not run", "not implemented", "out of range", "out of bounds", "no kernel")
"""Error texts of an op that cannot run here (rather than of a real failure, such as running out of memory)."""


DENIED_NAMESPACES = frozenset({"c10d", "_c10d_functional", "_dtensor", "rpc", "profiler", "prim"})
"""Communication belongs to the strategy, not to the trace; profiler markers and prims do no work."""


class Unsupported(Exception):
    """An op the replay runs as a FLOP burn, with the reason."""


# -- arguments ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Ref:
    index: int


@dataclass(frozen=True)
class _Seq:
    items: tuple[Any, ...]


def decode(value: Any, device: torch.device) -> Any:
    """An encoded argument as a template: tensor references stay references until the op runs."""
    if isinstance(value, dict):
        key, inner = next(iter(value.items()))
        if key == "t":
            return _Ref(inner)
        if key == "dtype":
            if inner not in DTYPES:
                raise Unsupported(f"dtype {inner!r} is not known to this torch")
            return DTYPES[inner]
        if key == "device":
            return device
        if key == "layout":
            if inner not in _LAYOUTS:
                raise Unsupported(f"layout {inner!r}")
            return _LAYOUTS[inner]
        if key == "memory_format":
            if inner not in _MEMORY_FORMATS:
                raise Unsupported(f"memory format {inner!r}")
            return _MEMORY_FORMATS[inner]
        if key == "float":
            return float(inner)
        if key == "complex":
            return complex(inner[0], inner[1])
        raise Unsupported(f"an argument of type {inner} that the trace could not record")
    if isinstance(value, list):
        items = tuple(decode(item, device) for item in value)
        return _Seq(items) if any(isinstance(i, (_Ref, _Seq)) for i in items) else list(items)
    return value


def _build(template: Any, env: list[Any]) -> Any:
    if type(template) is _Ref:
        return env[template.index]
    if type(template) is _Seq:
        return [_build(item, env) for item in template.items]
    return template


def resolve(name: str) -> torch._ops.OpOverload:
    """`aten::mm.default` as the op itself; Unsupported when this process has no such op."""
    namespace, _, rest = name.partition("::")
    packet_name, _, overload = rest.partition(".")
    if namespace in DENIED_NAMESPACES or namespace.startswith("__") or packet_name.startswith("__"):
        raise Unsupported(f"ops of namespace {namespace!r} are not replayed")
    try:
        op = getattr(getattr(getattr(torch.ops, namespace), packet_name), overload or "default")
    except (AttributeError, RuntimeError):
        raise Unsupported("no such op in this process (a custom op whose library is not loaded)") from None
    if not isinstance(op, torch._ops.OpOverload):
        raise Unsupported("not a dispatcher op")
    return op


def device_problem(op: torch._ops.OpOverload, device: torch.device) -> str | None:
    key = "CUDA" if device.type == "cuda" else "CPU"
    if torch._C._dispatch_has_computed_kernel_for_dispatch_key(op.name(), key):
        return None
    return f"no {key} kernel"


# -- the program -------------------------------------------------------------------------------------


@dataclass
class _Step:
    index: int
    name: str
    call: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    out: int | tuple[int | None, ...] | None
    grad: bool
    free: tuple[int, ...] = ()
    templated: bool = True


@dataclass
class TraceProgram:
    """The forward ops compiled for one device: resolved ops, argument templates, and when to drop what."""

    trace: OperatorTrace
    device: torch.device
    steps: list[_Step] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)
    """op name -> why it runs as a burn here."""

    @classmethod
    def compile(cls, trace: OperatorTrace, device: torch.device) -> TraceProgram:
        program = cls(trace, device)
        last_use = _last_uses(trace)
        keep = {trace.loss} if trace.loss is not None else set()
        frees: dict[int, list[int]] = {}
        for tensor, position in last_use.items():
            if tensor not in keep:
                frees.setdefault(position, []).append(tensor)
        for position, op in enumerate(trace.forward):
            step = program._step(position, op)
            step.free = tuple(frees.get(position, ()))
            program.steps.append(step)
        return program

    def _step(self, position: int, op: TraceOp) -> _Step:
        out = _output_slots(op.out)
        try:
            func = resolve(op.op)
            problem = device_problem(func, self.device)
            if problem is not None:
                raise Unsupported(problem)
            args = tuple(decode(a, self.device) for a in op.args)
            kwargs = {key: decode(value, self.device) for key, value in op.kwargs.items()}
        except Unsupported as why:
            self.notes.setdefault(op.op, str(why))
            return self._burn_step(position, op, out)
        templated = any(isinstance(a, (_Ref, _Seq)) for a in (*args, *kwargs.values()))
        return _Step(position, op.op, func, args, kwargs, out, op.grad, templated=templated)

    def _burn_step(self, position: int, op: TraceOp, out: Any) -> _Step:
        inputs = tuple(_Ref(i) for i in dict.fromkeys(tensor_refs([op.args, list(op.kwargs.values())])))
        metas = [self.trace.tensors[i] for i in tensor_refs(op.out)]
        burn = _BurnCall(op.flops, metas, self.device)
        return _Step(position, op.op, burn, (_Seq(inputs),), {}, out, op.grad)

    def run(self, env: list[Any]) -> Any:
        """Execute every step on `env` (tensor number -> tensor), which it fills and empties as it goes."""
        args: Sequence[Any]
        for step in self.steps:
            if step.templated:
                args = [_build(a, env) for a in step.args]
                kwargs = {k: _build(v, env) for k, v in step.kwargs.items()} if step.kwargs else {}
            else:
                args, kwargs = step.args, step.kwargs
            try:
                if step.grad:
                    result = step.call(*args, **kwargs)
                else:
                    with torch.no_grad():
                        result = step.call(*args, **kwargs)
            except (NotImplementedError, RuntimeError, IndexError) as error:
                result = self._recover(step, error, env)
            out = step.out
            if isinstance(out, int):
                env[out] = result
            elif out is not None:
                for slot, value in zip(out, result, strict=False):
                    if slot is not None:
                        env[slot] = value
            for index in step.free:
                env[index] = None
        return env[self.trace.loss] if self.trace.loss is not None else None

    def _recover(self, step: _Step, error: Exception, env: list[Any]) -> Any:
        """An op that turns out not to run here becomes a burn from now on; any other failure is real."""
        if isinstance(step.call, _BurnCall) or not any(m in str(error).lower() for m in _RECOVERABLE):
            raise error
        self.notes.setdefault(step.name, f"{type(error).__name__}: {str(error).splitlines()[0][:200]}")
        op = self.trace.forward[step.index]
        replacement = self._burn_step(step.index, op, step.out)
        replacement.free = step.free
        self.steps[step.index] = replacement
        return replacement.call(*[_build(a, env) for a in replacement.args])


def _output_slots(out: Any) -> int | tuple[int | None, ...] | None:
    if isinstance(out, dict) and "t" in out:
        return int(out["t"])
    if isinstance(out, list):
        return tuple(int(item["t"]) if isinstance(item, dict) and "t" in item else None for item in out)
    return None


def _last_uses(trace: OperatorTrace) -> dict[int, int]:
    """For each tensor, the last forward op that reads or writes it: after it, the replay drops its reference."""
    last: dict[int, int] = {}
    for position, op in enumerate(trace.forward):
        for index in tensor_refs([op.args, list(op.kwargs.values()), op.out]):
            last[index] = position
    return last


class _BurnCall:
    """Stands in for an op that cannot run: outputs of the recorded shapes, the recorded FLOPs burnt."""

    def __init__(self, flops: float, outputs: list[TraceTensor], device: torch.device) -> None:
        self.flops = flops
        self.outputs = outputs
        self.device = device

    def __call__(self, inputs: list[Any]) -> Any:
        if not self.outputs:
            from trial_runner.replay import burn_flops

            burn_flops(self.device, torch.float32, self.flops)
            return None
        results = _Burn.apply(self, *[t for t in inputs if isinstance(t, torch.Tensor)])
        return results if len(self.outputs) > 1 else results[0]


class _Burn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, call: _BurnCall, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from trial_runner.replay import burn_flops

        ctx.call = call
        ctx.shapes = [(t.shape, t.dtype, t.device) for t in inputs]
        burn_flops(call.device, torch.float32, call.flops)
        return tuple(
            torch.zeros(meta.shape, dtype=torch_dtype(meta.dtype), device=call.device) for meta in call.outputs
        )

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        from trial_runner.replay import burn_flops

        burn_flops(ctx.call.device, torch.float32, 2.0 * ctx.call.flops)
        return (
            None,
            *(
                torch.zeros(shape, dtype=dtype, device=device) if dtype.is_floating_point else None
                for shape, dtype, device in ctx.shapes
            ),
        )


# -- the module's side ------------------------------------------------------------------------------


class TraceReplay:
    """What a ReplayModel needs to run a trace: its buffers, its batch, and the compiled forward."""

    def __init__(self, trace: OperatorTrace, variables: dict[str, list[int]]) -> None:
        self.trace = trace
        self.bounds = input_bounds(trace)
        self.parameters: dict[int, str] = {}
        self.buffers: dict[int, str] = {}
        self.constants: dict[int, TraceTensor] = {}
        problems = []
        read_forward = {i for op in trace.forward for i in tensor_refs([op.args, list(op.kwargs.values())])}
        for index, meta in enumerate(trace.tensors):
            if meta.source == "parameter" and meta.name is not None:
                if variables.get(meta.name) != meta.shape:
                    got = variables.get(meta.name)
                    problems.append(
                        Problem(
                            "trace_id",
                            f"the trace's parameter {meta.name!r} has shape {meta.shape}, the graph's "
                            f"{'has no such variable' if got is None else f'variable has {got}'}",
                        )
                    )
                self.parameters[index] = meta.name
            elif meta.source == "buffer" and meta.name is not None:
                self.buffers[index] = meta.name
            elif meta.source == "constant" and index in read_forward:
                self.constants[index] = meta
        if problems:
            raise InvalidGraphError(problems[:10])
        if trace.loss is None:
            raise InvalidGraphError([Problem("trace_id", "the operator trace records no loss to run backward from")])
        self._programs: dict[str, TraceProgram] = {}
        self._constant_values: dict[str, dict[int, torch.Tensor]] = {}

    @property
    def notes(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for program in self._programs.values():
            found.update(program.notes)
        return found

    def make_buffer(self, index: int) -> torch.Tensor:
        meta = self.trace.tensors[index]
        return make_tensor(meta, self.bounds.get(index), torch.device("cpu"), ones=True)

    def make_batch(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        if batch_size != self.trace.batch_size:
            raise InvalidGraphError(
                [
                    Problem(
                        "batch_size",
                        f"an operator trace replays at the batch it was captured at ({self.trace.batch_size}), "
                        f"not {batch_size}",
                    )
                ]
            )
        device = torch.device("cpu")
        batch = []
        for index in self.trace.inputs:
            meta = self.trace.tensors[index]
            tensor = make_tensor(meta, self.bounds.get(index), device)
            batch.append(tensor.requires_grad_(True) if meta.requires_grad and tensor.is_floating_point() else tensor)
        return tuple(batch)

    def run(self, lookup: Callable[[str], torch.Tensor], buffer: Callable[[str], torch.Tensor], inputs: Any) -> Any:
        if len(inputs) != len(self.trace.inputs):
            raise InvalidGraphError(
                [Problem("inputs", f"the trace takes {len(self.trace.inputs)} batch tensors, got {len(inputs)}")]
            )
        device = inputs[0].device if inputs else torch.device("cpu")
        program = self._program(device)
        env: list[Any] = [None] * len(self.trace.tensors)
        for index, name in self.parameters.items():
            env[index] = lookup(name)
        for index, name in self.buffers.items():
            env[index] = buffer(name)
        for index, value in self._constants(device).items():
            env[index] = value
        for index, value in zip(self.trace.inputs, inputs, strict=True):
            env[index] = value
        return program.run(env)

    def _program(self, device: torch.device) -> TraceProgram:
        key = str(device)
        program = self._programs.get(key)
        if program is None:
            program = self._programs[key] = TraceProgram.compile(self.trace, device)
        return program

    def _constants(self, device: torch.device) -> dict[int, torch.Tensor]:
        """Constants are made once per device, the same on every rank (they are part of the model)."""
        key = str(device)
        values = self._constant_values.get(key)
        if values is None:
            generator_state = torch.random.get_rng_state()
            torch.manual_seed(0)
            values = {i: make_tensor(m, self.bounds.get(i), device) for i, m in self.constants.items()}
            torch.random.set_rng_state(generator_state)
            self._constant_values[key] = values
        return values


def register_buffers(module: nn.Module, replay: TraceReplay) -> None:
    """The trace's buffers as real buffers at their dotted names, so moving and broadcasting the module moves them."""
    for index, name in replay.buffers.items():
        *path, leaf = name.split(".")
        owner = module
        for part in path:
            owner = owner._modules.setdefault(part, nn.Module())  # type: ignore[assignment]
        if leaf in owner._parameters or leaf in owner._modules:
            raise InvalidGraphError([Problem("trace_id", f"buffer {name!r} collides with a parameter or module")])
        owner._buffers[leaf] = replay.make_buffer(index)


def replay_notes(trace: OperatorTrace, device_type: str = "cpu") -> list[str]:
    """The ops a replay on this kind of device would run as FLOP burns, with why, for a job's notes."""
    program = TraceProgram.compile(trace, torch.device(device_type))
    return [f"{name} ({why})" for name, why in sorted(program.notes.items())]


def step_flops(trace: OperatorTrace) -> float:
    return math.fsum(op.flops for op in (*trace.forward, *trace.backward))
