"""Compute probes: what a rank's kernels reach, each priced on the bytes or FLOPs the simulator counts.

Every probe runs on all ranks at once (through a `Stepper`), from cold caches, and returns a rate (or a
time) on call:

- matmul FLOP/s: a Linear layer's forward and backward (its three matmuls), fp32; a bf16 matmul;
- convolution FLOP/s: a 3x3 convolution's forward and backward -> `conv_efficiency` (vs. matmul);
- memory bandwidth: copying 64 MB (read + write bytes per second);
- element-wise kernels (GELU, ReLU) and normalizations (LayerNorm, BatchNorm), forward and backward,
  priced on the bytes the simulator counts for them (each op's inputs and outputs forward, twice that
  backward) -> `elementwise_efficiency` and `norm_efficiency`;
- per-layer overhead of training: a chain of tiny Linear layers, forward and backward; the difference
  between a long and a short chain, per layer and pass, so the backward call's own cost cancels
  -> `launch_overhead_s`;
- the optimizer update: Adam's step over 8M parameters (more than a last-level cache holds), priced
  on the bytes the simulator counts (3 x parameters + 2 x state), once in 2 MB tensors and once in
  one 32 MB tensor: a large tensor costs more per byte (each of the update's passes, and the fresh
  pages of its temporaries, come from memory) -> `optimizer_efficiency` (small tensors) and
  `optimizer_knee_bytes` (`figures.optimizer_size_law`);
- an Adam step over 256 tensors of 64 elements, per tensor -> `optimizer_tensor_s`;
- a plain streaming pass, the sum of two 16 MB gradients into a third (counted as its three tensors'
  bytes), as gradient compression makes around its casts and selections -> `stream_efficiency`;
- what gradient compression costs beyond streaming: fp32 -> fp16 -> fp32 casts of a 16 MB gradient
  (each cast counted as its fp32 bytes x 1.5) -> `cast_efficiency`, and the runtime's top-1% selection
  over it (`select_largest`, counted as one pass) -> `select_efficiency`, and the same over its first
  128K entries, which the runtime selects in one full `topk` -> `full_select_efficiency`;
- PowerSGD rank 4 on 16 MB of gradients, run by the runtime's own reducer (counted as the simulator's
  nine passes), once as 16 matrices of 1 MB and once as one of 16 MB -> `lowrank_efficiency` and
  `lowrank_knee_bytes` (`figures.size_law`);
- coalescing an embedding gradient of 16384 lookups (its values and int64 indices) -> `coalesce_efficiency`.

The sizes are a CPU's (`ProbeShapes()`); a GPU runs the same probes at its own (`gpu.GPU_PROBES`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from stratagem.calibrate.figures import OPTIMIZER_TENSOR_BYTES, UPDATE_BYTES_PER_PARAM
from stratagem.calibrate.timing import Stepper
from stratagem.runtime.comm import Team
from stratagem.runtime.compression import PowerSGDReducer, select_largest


@dataclass(frozen=True)
class ProbeShapes:
    """The sizes the compute probes run at. A CPU's (the defaults) take milliseconds per repeat there; an
    accelerator runs them in microseconds, where a kernel's launch and not its rate would be timed, so
    it gets its own (`gpu.GPU_PROBES`)."""

    linear: tuple[int, int] = (1024, 512)
    """Tokens and width of the Linear layer timed for the matmul rate."""
    bf16_side: int = 512
    images: tuple[int, int, int, int] = (16, 32, 32, 32)
    """Batch, channels, height and width of the convolution's and BatchNorm's input."""
    tokens: tuple[int, int] = (2048, 512)
    """Tokens and width of GELU's and LayerNorm's input."""
    copy_elements: int = 16 << 20
    gradient_elements: int = 4 << 20
    optimizer_bytes: int = 32 << 20
    """Parameter bytes of the optimizer probes (in tensors of `OPTIMIZER_TENSOR_BYTES`)."""
    lowrank: tuple[tuple[int, int], tuple[int, int]] = ((16, 512), (1, 2048))
    """(matrices, side) of the two PowerSGD probes: `LOWRANK_MATRIX_BYTES` per matrix."""
    lookups: tuple[int, int] = (16384, 20000)
    """Lookups and table rows of the coalescing probe."""


FULL_SELECTION_ENTRIES = 1 << 17
"""Entries of the full-selection probe: at 1% the runtime selects them in one `topk`, as it does a
DLRM's 85,000 dense gradients (`stratagem.topk_selection.full_selection`)."""
LOWRANK_PASSES = 9
"""Passes over a gradient the simulator counts for PowerSGD (three for the rank-r products, six for
adding and keeping the error)."""


def compute_figures(stepper: Stepper, shapes: ProbeShapes = ProbeShapes(), device: str = "cpu") -> dict[str, float]:
    """This rank's compute, memory, per-layer and optimizer figures, every probe run by all ranks at once."""
    return {name: probe() for name, probe in probes(stepper, shapes, device).items()}


def probes(
    stepper: Stepper, shapes: ProbeShapes = ProbeShapes(), device: str = "cpu"
) -> dict[str, Callable[[], float]]:
    """The compute figures' probes by name, each a measurement run on call (by all ranks at once)."""
    tokens, width = shapes.linear
    side = shapes.bf16_side
    x = torch.randn(tokens, width, requires_grad=True, device=device)
    a, b = (torch.randn(side, side, dtype=torch.bfloat16, device=device) for _ in range(2))
    channels = shapes.images[1]
    images = torch.randn(*shapes.images, requires_grad=True, device=device)
    src = torch.ones(shapes.copy_elements, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    grad = torch.randn(shapes.gradient_elements, device=device)
    half, magnitudes = torch.empty_like(grad, dtype=torch.float16), grad.abs()
    other, total = torch.randn_like(grad), torch.empty_like(grad)
    (small, small_side), (large, large_side) = shapes.lowrank
    return {
        "matmul_flops": lambda: (
            3
            * 2.0
            * tokens
            * width
            * width
            / stepper.median(_train_pass(nn.Linear(width, width, bias=False, device=device), x), budget_s=1.0)
        ),
        "bf16_flops": lambda: 2.0 * side**3 / stepper.median(lambda: torch.mm(a, b), budget_s=0.5),
        "conv_flops": lambda: (
            3
            * 2.0
            * 9
            * channels
            * images.numel()
            / stepper.median(
                _train_pass(nn.Conv2d(channels, channels, 3, padding=1, bias=False, device=device), images),
                budget_s=1.0,
            )
        ),
        "copy_bandwidth": lambda: 2.0 * src.nbytes / stepper.median(lambda: dst.copy_(src), budget_s=0.5),
        "elementwise_rate": lambda: _memory_bound_rate(stepper, shapes, device, norms=False),
        "norm_rate": lambda: _memory_bound_rate(stepper, shapes, device, norms=True),
        "layer_overhead_s": lambda: _layer_overhead(stepper, device),
        "optimizer_rate": optimizer_probe(stepper, device, total_bytes=shapes.optimizer_bytes),
        "optimizer_large_rate": optimizer_probe(
            stepper, device, tensor_bytes=OPTIMIZER_TENSOR_BYTES[1], total_bytes=shapes.optimizer_bytes
        ),
        "optimizer_tensor_s": optimizer_tensor_probe(stepper, device),
        "stream_rate": lambda: (
            3 * grad.nbytes / stepper.median(lambda: torch.add(grad, other, out=total), budget_s=0.5)
        ),
        "cast_rate": lambda: 2 * 1.5 * grad.nbytes / stepper.median(lambda: grad.copy_(half.copy_(grad)), budget_s=0.5),
        "select_rate": lambda: (
            grad.nbytes / stepper.median(lambda: select_largest(magnitudes, grad.numel() // 100), budget_s=0.5)
        ),
        "full_select_rate": lambda: (
            FULL_SELECTION_ENTRIES
            * 4
            / stepper.median(
                lambda: select_largest(magnitudes[:FULL_SELECTION_ENTRIES], FULL_SELECTION_ENTRIES // 100), budget_s=0.3
            )
        ),
        "lowrank_rate": _lowrank_probe(stepper, device, matrices=small, side=small_side),
        "lowrank_large_rate": _lowrank_probe(stepper, device, matrices=large, side=large_side),
        "coalesce_rate": _coalesce_probe(stepper, device, lookups=shapes.lookups[0], rows=shapes.lookups[1]),
    }


def _train_pass(module: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        module(x).sum().backward()

    return run


def _coalesce_probe(stepper: Stepper, device: str, *, lookups: int, rows: int, dim: int = 32) -> Callable[[], float]:
    """Coalescing a fresh embedding gradient (on a CPU, 16384 lookups of 32-float rows in a 20000-row
    table), on the bytes the simulator counts: each lookup's values and int64 index."""
    index = torch.randint(0, rows, (1, lookups), device=device)
    values = torch.randn(lookups, dim, device=device)

    def run() -> None:
        torch.sparse_coo_tensor(index, values, (rows, dim), check_invariants=False).coalesce()

    return lambda: lookups * (dim * 4 + 8) / stepper.median(run, budget_s=0.5)


def _lowrank_probe(stepper: Stepper, device: str, *, matrices: int, side: int, rank: int = 4) -> Callable[[], float]:
    """PowerSGD rank 4 on square gradients (16 MB on a CPU), as the runtime's reducer runs it on a
    one-rank team (no collective), priced on the passes the simulator counts: its skinny products, QR
    and error feedback stream the gradient far below a copy's rate on a CPU, and the transposed product
    of a matrix beyond the caches reads it with a stride (several times slower per byte: the size law)."""
    grads = [torch.randn(side, side, device=device) for _ in range(matrices)]
    reducer = PowerSGDReducer(Team([0], [0], None), rank=rank, error_feedback=True, seed=0)

    def run() -> None:
        reducer.start(grads)
        reducer.finish()

    return lambda: LOWRANK_PASSES * sum(g.nbytes for g in grads) / stepper.median(run, budget_s=0.5)


def _memory_bound_rate(stepper: Stepper, shapes: ProbeShapes, device: str, *, norms: bool) -> float:
    """Bytes/s of activations (GELU, ReLU) or normalizations (LayerNorm, BatchNorm), on the bytes the
    simulator counts: forward reads and writes each tensor once per op, backward twice the forward."""
    tokens = torch.randn(*shapes.tokens, requires_grad=True, device=device)
    images = torch.randn(*shapes.images, requires_grad=True, device=device)
    layer_norm, batch_norm = (
        nn.LayerNorm(shapes.tokens[1], device=device),
        nn.BatchNorm2d(shapes.images[1], device=device),
    )
    first, second = (layer_norm, batch_norm) if norms else (nn.functional.gelu, torch.relu)

    def run() -> None:
        (first(tokens).sum() + second(images).sum()).backward()

    forward_bytes = 2.0 * (tokens.nbytes + images.nbytes)
    return 3 * forward_bytes / stepper.median(run, budget_s=1.0)


def _layer_overhead(stepper: Stepper, device: str = "cpu") -> float:
    """Seconds per layer and pass beyond arithmetic: (long chain - short chain) / (2 passes x extra layers)."""
    x = torch.randn(1, 4, device=device)
    long_chain = nn.Sequential(*[nn.Linear(4, 4) for _ in range(64)]).to(device)
    short_chain = nn.Sequential(*[nn.Linear(4, 4) for _ in range(8)]).to(device)
    long = stepper.median(_train_pass(long_chain, x), budget_s=0.5, least=5)
    short = stepper.median(_train_pass(short_chain, x), budget_s=0.3, least=5)
    return (long - short) / (2 * (64 - 8))


def optimizer_probe(
    stepper: Stepper, device: str, *, tensor_bytes: int = OPTIMIZER_TENSOR_BYTES[0], total_bytes: int = 32 << 20
) -> Callable[[], float]:
    """Bytes/s of an Adam step over `total_bytes` of parameters in tensors of `tensor_bytes` (with
    gradients and state, four times that: beyond a CPU's caches), on the bytes the simulator counts.
    The parameters and state are made once, so repeated probes time the step, not the allocation."""
    params = [
        torch.zeros(tensor_bytes // 4, requires_grad=True, device=device)
        for _ in range(max(1, total_bytes // tensor_bytes))
    ]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.Adam(params)
    count = sum(p.numel() for p in params)
    return lambda: UPDATE_BYTES_PER_PARAM * count / stepper.median(optimizer.step, budget_s=1.0)


def optimizer_tensor_probe(
    stepper: Stepper, device: str, *, tensors: int = 256, elements: int = 64, foreach: bool | None = None
) -> Callable[[], float]:
    """Seconds per tensor of an Adam step over many tiny tensors, whose bytes cost nothing next to
    the per-tensor operations it launches (`foreach` False: the per-tensor loop even on CUDA)."""
    params = [torch.zeros(elements, requires_grad=True, device=device) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.Adam(params, foreach=foreach)
    return lambda: stepper.median(optimizer.step, budget_s=0.3) / tensors
