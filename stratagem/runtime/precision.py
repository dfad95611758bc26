"""Numerics of a step (`Strategy.precision`): autocast, half-precision models, TF32, fp8, loss scaling.

- `fp32`: nothing changes (TF32 stays as the process set it).
- `tf32`: TF32 tensor-core matmuls and convolutions on CUDA (`torch.backends.cuda.matmul.allow_tf32`,
  `torch.backends.cudnn.allow_tf32`, process-wide); a CPU has no TF32, so there it changes nothing.
- `amp-bf16`, `amp-fp16`: parameters, gradients and optimizer state stay fp32; the model's forward runs
  under `torch.autocast` (matmuls in half precision, softmax and norms in fp32) and its floating outputs
  come back as fp32, as Accelerate's `convert_outputs_to_fp32` does, so the user's loss is computed in
  fp32. Gradients are reduced in fp32. Under FSDP2 its `MixedPrecisionPolicy` gathers the sharded
  parameters in the half type and reduce-scatters gradients in fp32 (torchtitan's default).
- `amp-fp16` adds dynamic loss scaling with `torch.amp.GradScaler`'s rule (`LossScaler`).
- `bf16`: the model itself in bf16 (parameters, gradients, collectives), stepped through fp32 master
  copies with fp32 optimizer state (`updates.MasterUpdater`); floating inputs are cast to it and
  floating outputs back to fp32.
- `fp8`: torchao's float8 training (per-tensor scaling) on the Linear layers, bf16 autocast elsewhere.
  It needs fp8 tensor cores (CUDA compute capability 8.9 or newer: L4, H100) and torchao; anything
  else is refused before any collective. With `fp8_all_gather`, the converted Linears' weights are
  wrapped so FSDP2 gathers them already cast to fp8 (torchao's `enable_fsdp_float8_all_gather`).
- `async_tensor_parallel` is refused: it fuses sequence parallelism's collectives into the matmuls
  inside compiled blocks through CUDA symmetric memory (inductor's micro-pipeline pass, as torchtitan
  runs it), and this runtime neither compiles the blocks nor has symmetric memory on CPU ranks.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from stratagem.ir import Strategy
from stratagem.parallel_rules import master_weights_refusal
from stratagem.runtime.plan import local_tensor

HALF = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}
AUTOCAST = ("amp-bf16", "amp-fp16", "fp8")
FP8_CAPABILITY = (8, 9)


def precision_refusal(strategy: Strategy, device_kind: str) -> str | None:
    """Why this runtime cannot run the strategy's precision on a replica of `device_kind` (CPU or GPU), or None."""
    master = master_weights_refusal(strategy.precision)
    if master is not None:
        return f"precision {master}"
    if strategy.precision != "fp8":
        return None
    if device_kind != "GPU":
        return (
            "precision 'fp8' runs fp8 matmuls on tensor cores (CUDA compute capability 8.9 or newer: L4, H100); "
            "a CPU replica has none"
        )
    if not torch.cuda.is_available():
        return "precision 'fp8' needs CUDA, and this process has no CUDA device"
    if torch.cuda.get_device_capability() < FP8_CAPABILITY:
        major, minor = torch.cuda.get_device_capability()
        return f"precision 'fp8' needs CUDA compute capability 8.9 or newer (L4, H100); this GPU has {major}.{minor}"
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        return "precision 'fp8' runs through torchao's float8 training: pip install torchao"
    if strategy.effective_mesh.tensor > 1:
        return "precision 'fp8' with tensor parallelism needs torchao's float8 parallel styles, which this runtime does not use"
    return None


def set_matmul_precision(strategy: Strategy, device: torch.device) -> None:
    """TF32 for `tf32` on CUDA (process-wide, like the flags it sets); nothing on a CPU."""
    if strategy.precision == "tf32" and device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def half_parameters(model: nn.Module, strategy: Strategy) -> None:
    """`bf16`: the model itself in bf16, before its parameters are broadcast and handed to executors."""
    if strategy.precision == "bf16":
        model.to(torch.bfloat16)


def async_tensor_parallel_refusal(strategy: Strategy, device_kind: str) -> str | None:
    """Why this runtime cannot run the strategy's async tensor parallelism, or None when it asks for none."""
    if not strategy.async_tensor_parallel:
        return None
    if device_kind != "GPU":
        return (
            "async_tensor_parallel pipelines tensor-parallel collectives through CUDA symmetric memory inside "
            "inductor-compiled matmuls (torch._inductor.config._micro_pipeline_tp); CPU ranks under gloo have neither"
        )
    return (
        "async_tensor_parallel needs every block compiled by torch.compile with inductor's micro-pipeline pass, "
        "which this runtime does not run; export the layout to torchtitan (enable_async_tensor_parallel with "
        "compile enabled)"
    )


def convert_fp8(model: nn.Module, *, fp8_all_gather: bool = False) -> list[str]:
    """torchao's float8 training on every Linear whose dimensions fp8 matmuls take (multiples of 16); with
    `fp8_all_gather`, FSDP2 gathers their weights in fp8."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    converted: list[str] = []

    def accept(module: nn.Module, name: str) -> bool:
        ok = isinstance(module, nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0
        if ok:
            converted.append(name)
        return ok

    config = Float8LinearConfig(enable_fsdp_float8_all_gather=fp8_all_gather)
    convert_to_float8_training(model, module_filter_fn=accept, config=config)
    return converted


def fsdp_mixed_precision(strategy: Strategy) -> Any:
    """FSDP2's policy: parameters gathered in the half type under amp, gradients reduced in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if strategy.precision in AUTOCAST:
        return MixedPrecisionPolicy(param_dtype=HALF[strategy.precision], reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


class LossScaler:
    """Dynamic loss scaling for `amp-fp16`, with `torch.amp.GradScaler`'s defaults and rule: the scale
    starts at 2**16, halves after a step whose gradients overflowed (that step is skipped on every rank)
    and doubles after 2000 steps without overflow.

    The user's `loss.backward()` stays as it is: the gradient entering the model's outputs is multiplied
    by the scale (the same as scaling the loss), and each parameter's incoming gradient is divided by it
    before it accumulates, so executors, compressors and optimizers see true gradients. Gradients FSDP2
    reduce-scatters onto its sharded parameters are unscaled at the step. Overflow is checked on every
    rank and agreed over the whole process group before any update."""

    def __init__(
        self,
        device: torch.device,
        *,
        group: dist.ProcessGroup | None = None,
        init_scale: float = 2.0**16,
        growth_interval: int = 2000,
    ) -> None:
        self.group = group
        """The ranks that agree on overflow: the process group `distribute` runs in."""
        self.scale = init_scale
        self.growth_factor, self.backoff_factor, self.growth_interval = 2.0, 0.5, growth_interval
        self.good_steps = 0
        self.skipped = 0
        self.found = torch.zeros((), device=device)
        self._sharded: list[nn.Parameter] = []
        self._handles: list[Any] = []

    def watch(self, params: Iterable[nn.Parameter], *, sharded: Iterable[nn.Parameter] = ()) -> None:
        """Unscale the gradients of `params` as they arrive; those of `sharded` (FSDP2's) at the step."""
        hook = _weak_unscale(self)
        self._handles += [p.register_hook(hook) for p in params if p.requires_grad]
        self._sharded += [p for p in sharded if p.requires_grad]
        weakref.finalize(self, _remove_all, self._handles)

    def scale_output_grad(self, grad: torch.Tensor) -> torch.Tensor:
        return grad * self.scale

    def unscale(self, grad: torch.Tensor) -> torch.Tensor:
        out = grad * (1.0 / self.scale)
        values = out._values() if out.is_sparse else local_tensor(out)
        self.found += (~torch.isfinite(values)).any().to(self.found.dtype)
        return out

    def ready(self) -> bool:
        """Whether this step's gradients are finite on every rank; updates the scale either way."""
        with torch.no_grad():
            for p in self._sharded:
                if p.grad is not None:
                    p.grad.mul_(1.0 / self.scale)
                    self.found += (~torch.isfinite(local_tensor(p.grad))).any().to(self.found.dtype)
        found = self.found.clone()
        if dist.is_initialized() and dist.get_world_size(self.group) > 1:
            dist.all_reduce(found, op=dist.ReduceOp.MAX, group=self.group)
        self.found.zero_()
        if float(found) > 0:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            self.skipped += 1
            return False
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0
        return True


def _weak_unscale(scaler: LossScaler) -> Callable[[torch.Tensor], torch.Tensor]:
    """A gradient hook that does not keep the scaler alive (see executor._weak_hook)."""
    ref = weakref.ref(scaler)

    def unscale(grad: torch.Tensor) -> torch.Tensor:
        target = ref()
        return grad if target is None else target.unscale(grad)

    return unscale


def _remove_all(handles: list[Any]) -> None:
    for handle in handles:
        handle.remove()


def apply_precision_forward(
    model: nn.Module, strategy: Strategy, device: torch.device, scaler: LossScaler | None
) -> None:
    """Run the model's forward under the strategy's precision: autocast (and loss scaling), or half inputs
    for a bf16 model, with floating outputs back in fp32. The module stays the same object."""
    if strategy.precision not in (*AUTOCAST, "bf16"):
        return
    dtype = HALF[strategy.precision]
    autocast = strategy.precision in AUTOCAST
    forward = model.forward
    model.__dict__["forward"] = functools.partial(
        _precise_forward, forward, device_type=device.type, dtype=dtype, autocast=autocast, scaler=scaler
    )


def _precise_forward(
    forward: Callable[..., Any],
    *args: Any,
    device_type: str,
    dtype: torch.dtype,
    autocast: bool,
    scaler: LossScaler | None,
    **kwargs: Any,
) -> Any:
    if autocast:
        with torch.autocast(device_type, dtype=dtype):
            out = forward(*args, **kwargs)
    else:
        out = forward(*_cast(args, dtype), **_cast(kwargs, dtype))
    return _outputs_fp32(out, scaler if torch.is_grad_enabled() else None)


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, tuple | list):
        return type(value)(_cast(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    return value


def _outputs_fp32(value: Any, scaler: LossScaler | None) -> Any:
    """Floating tensors as fp32, anywhere in tuples, lists and mappings (a Hugging Face ModelOutput is
    one); with a loss scaler each one's incoming gradient is scaled."""
    if isinstance(value, torch.Tensor):
        out = value.float() if value.is_floating_point() else value
        if scaler is not None and out.requires_grad:
            out.register_hook(scaler.scale_output_grad)
        return out
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_outputs_fp32(v, scaler) for v in value))
    if isinstance(value, tuple | list):
        return type(value)(_outputs_fp32(v, scaler) for v in value)
    if isinstance(value, Mapping):
        for key in list(value.keys()):
            value[key] = _outputs_fp32(value[key], scaler)  # type: ignore[index]
        return value
    return value


class StepNumerics:
    """The precision of a pipeline step, whose forward and backward the schedule runs: autocast around
    the schedule, bf16 inputs for a bf16 model, the last stage's output scored in fp32 and, under
    amp-fp16, the loss scaled for the schedule's backward and reported unscaled."""

    def __init__(self, precision: str = "fp32", device_type: str = "cpu", scaler: LossScaler | None = None) -> None:
        self.precision = precision
        self.device_type = device_type
        self.scaler = scaler

    def context(self) -> Any:
        import contextlib

        if self.precision in AUTOCAST:
            return torch.autocast(self.device_type, dtype=HALF[self.precision])
        return contextlib.nullcontext()

    def inputs(self, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        return _cast(inputs, torch.bfloat16) if self.precision == "bf16" else inputs

    def loss_fn(self, loss_fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        scaler = self.scaler

        def scored(output: Any, *rest: Any) -> torch.Tensor:
            if isinstance(output, torch.Tensor) and output.is_floating_point():
                output = output.float()
            loss = loss_fn(output, *rest)
            return loss * scaler.scale if scaler is not None else loss

        return scored

    def loss_value(self, loss: torch.Tensor) -> torch.Tensor:
        return loss / self.scaler.scale if self.scaler is not None else loss
