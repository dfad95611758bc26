"""GPU kernel probes: the figures `simulator.kernels` prices GEMMs and fused attention with, measured.

- GEMM rates at a few shapes and precisions: a large half-precision GEMM (the tensor cores'
  `matmul_efficiency` against the data-sheet peak), an IEEE fp32 one with TF32 off
  (`fp32_matmul_efficiency`), and the same half-precision GEMM cut to fewer output tiles than the device
  has SMs, to check the wave-quantization law against what cuBLAS does there (`small_gemm_ratio`: the
  small GEMM's rate over the large one's; the law predicts its tiles' share of a wave unless split-K
  fills it), and where the device runs them, the large GEMM as scaled fp8 (`torch._scaled_mm`, as
  torchao's float8 training runs it: `fp8_matmul_efficiency` against the fp8 peak);
- fused attention (`scaled_dot_product_attention`, causal, bf16): forward, and forward plus backward, on
  the FLOPs a fused kernel does (half the score matrix; backward 2.5 times forward) ->
  `attention_efficiency` and `attention_backward_efficiency` against the bf16 peak.

Each probe returns a rate; `kernel_figures` turns rates into efficiencies against the peaks it is given
(the catalog's for the device's kind). The shapes are a GPU's (`GPU_KERNEL_SHAPES`); tests run them on a
CPU at `KernelShapes` of a few hundred elements, where only the plumbing is checked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from stratagem.calibrate.figures import fraction
from stratagem.calibrate.timing import Stepper


@dataclass(frozen=True)
class KernelShapes:
    gemm: tuple[int, int, int] = (256, 256, 256)
    """M, N, K of the large GEMM."""
    small_rows: int = 64
    """M of the small GEMM (same N and K): few enough output tiles to leave SMs idle."""
    attention: tuple[int, int, int, int] = (1, 2, 128, 32)
    """Batch, heads, sequence and head dimension of the attention probe."""


GPU_KERNEL_SHAPES = KernelShapes(gemm=(8192, 8192, 8192), small_rows=256, attention=(4, 16, 4096, 128))
"""Sizes whose kernels run for milliseconds on a data-centre GPU; the small GEMM's 256 x 8192 output is
2 x 64 tiles of 128 x 128, fewer than a 132-SM H100 holds in one wave."""


def fp8_gemms(device: str) -> bool:
    """Whether `torch._scaled_mm` runs on `device`: fp8 tensor cores on CUDA (compute capability 8.9 and
    up); PyTorch's CPU kernel is a reference, which the tests run."""
    if not hasattr(torch, "float8_e4m3fn"):
        return False
    if device.startswith("cuda"):
        return torch.cuda.get_device_capability(device) >= (8, 9)
    return True


def tf32_gemms(device: str) -> bool:
    """Whether `device` has TF32 tensor cores (CUDA compute capability 8.0 and up: Ampere and later); a
    CPU has none, and PyTorch's flag changes nothing there."""
    return device.startswith("cuda") and torch.cuda.get_device_capability(device) >= (8, 0)


def kernel_probes(stepper: Stepper, shapes: KernelShapes, device: str) -> dict[str, Callable[[], float]]:
    """Rates (FLOP/s) by name, each measured on call."""
    m, n, k = shapes.gemm
    half = torch.bfloat16
    a, b = torch.randn(m, k, dtype=half, device=device), torch.randn(k, n, dtype=half, device=device)
    small = a[: shapes.small_rows].contiguous()
    a32, b32 = a.float(), b.float()
    batch, heads, seq, dim = shapes.attention
    q, key, v = (torch.randn(batch, heads, seq, dim, dtype=half, device=device, requires_grad=True) for _ in range(3))
    causal_flops = 0.5 * 4.0 * batch * heads * seq * seq * dim

    def attention_pass() -> None:
        out = F.scaled_dot_product_attention(q, key, v, is_causal=True)
        out.backward(torch.ones_like(out))

    probes: dict[str, Callable[[], float]] = {
        "gemm_bf16_flops": lambda: 2.0 * m * n * k / stepper.median(lambda: torch.mm(a, b), budget_s=0.5),
        "gemm_small_bf16_flops": lambda: (
            2.0 * shapes.small_rows * n * k / stepper.median(lambda: torch.mm(small, b), budget_s=0.5)
        ),
        "gemm_fp32_flops": lambda: (
            2.0 * m * n * k / stepper.median(_without_tf32(lambda: torch.mm(a32, b32)), budget_s=0.5)
        ),
        "attention_flops": lambda: (
            causal_flops
            / stepper.median(
                lambda: F.scaled_dot_product_attention(q.detach(), key.detach(), v.detach(), is_causal=True),
                budget_s=0.5,
            )
        ),
        "attention_training_flops": lambda: (1.0 + 2.5) * causal_flops / stepper.median(attention_pass, budget_s=0.5),
    }
    if tf32_gemms(device):
        probes["gemm_tf32_flops"] = lambda: (
            2.0 * m * n * k / stepper.median(_with_tf32(lambda: torch.mm(a32, b32)), budget_s=0.5)
        )
    if fp8_gemms(device):
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)

        def fp8_gemm() -> torch.Tensor:
            return torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=half)

        probes["gemm_fp8_flops"] = lambda: 2.0 * m * n * k / stepper.median(fp8_gemm, budget_s=0.5)
    return probes


def kernel_figures(
    rates: dict[str, float], *, bf16_peak: float, fp32_peak: float, sms: int, fp8_peak: float | None = None
) -> dict[str, float]:
    """Efficiencies for the catalog's fields from measured `rates` (see `kernel_probes`), against the
    data-sheet peaks of the device's kind: the backward's rate is what forward plus backward left after
    the forward's time."""
    forward = rates["attention_flops"]
    training = rates["attention_training_flops"]
    backward_time = 3.5 / training - 1.0 / forward
    backward = 2.5 / backward_time if backward_time > 0 else training
    figures = {
        "matmul_efficiency": fraction(rates["gemm_bf16_flops"] / bf16_peak),
        "fp32_matmul_efficiency": fraction(rates["gemm_fp32_flops"] / fp32_peak),
        "attention_efficiency": fraction(forward / bf16_peak),
        "attention_backward_efficiency": fraction(backward / bf16_peak),
        "small_gemm_ratio": rates["gemm_small_bf16_flops"] / rates["gemm_bf16_flops"],
        "sm_count": float(sms),
    }
    if fp8_peak and "gemm_fp8_flops" in rates:
        figures["fp8_matmul_efficiency"] = fraction(rates["gemm_fp8_flops"] / fp8_peak)
    return figures


def _without_tf32(run: Callable[[], object]) -> Callable[[], object]:
    """`run` with TF32 matmuls off, as PyTorch's default leaves them (an IEEE fp32 GEMM)."""
    return _tf32_set(run, False)


def _with_tf32(run: Callable[[], object]) -> Callable[[], object]:
    """`run` with TF32 matmuls on, as the `tf32` precision sets them."""
    return _tf32_set(run, True)


def _tf32_set(run: Callable[[], object], allow: bool) -> Callable[[], object]:
    def once() -> object:
        before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = allow
        try:
            return run()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = before

    return once
