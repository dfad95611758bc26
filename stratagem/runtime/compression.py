"""Gradient compressors for all-reduce buckets: none, fp16/bf16 casts, PowerSGD and top-k.

Each reducer averages a bucket's gradients over a team in two halves: `start` runs inside backward
as soon as the bucket is complete and launches the first collective asynchronously; `finish` runs at
the optimizer step and completes it. Error feedback keeps, per bucket, what compression dropped and
adds it to the next step's gradient, which is what makes lossy compression converge.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch

from stratagem.errors import UnsupportedStrategyError
from stratagem.ir import Compressor
from stratagem.runtime.comm import FlatBuffer, Team, Work, flatten, unflatten, wait
from stratagem.topk_selection import CANDIDATE_MARGIN, SMALL_SELECTION, full_selection, sample_size

WIRE_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
INT32_LIMIT = 2**31 - 1
"""Top-k indices travel as int32 (4 bytes, not 8) while a bucket's positions fit in one."""
TIED_CANDIDATES = 4
"""More candidates than this many times k mean the sampled threshold sits on a tie, not in a tail."""


def select_largest(magnitudes: torch.Tensor, k: int) -> torch.Tensor:
    """Positions of the k largest entries of a flat tensor of magnitudes (in no particular order).

    `torch.topk` over a whole bucket costs about 15 ns an entry on a CPU (it sorts a 16-byte pair per
    entry), several times a pass over memory. A threshold from a random sample keeps about 1.3·k
    candidates in one vectorized pass and the exact top k is chosen among them, so the result is the
    same set; a sample that set the threshold too high falls back to the full selection.
    """
    n = magnitudes.numel()
    if full_selection(n, k):
        return magnitudes.topk(k, sorted=False).indices
    size = int(sample_size(n, k))
    picks = torch.randint(n, (size,), generator=torch.Generator().manual_seed(k)).to(magnitudes.device)
    sample = magnitudes[picks]
    winners = min(size, math.ceil(CANDIDATE_MARGIN * k * size / n))
    threshold = sample.topk(winners, sorted=False).values.min()
    reached = magnitudes >= threshold
    count = int(torch.count_nonzero(reached))
    if count < k:
        return magnitudes.topk(k, sorted=False).indices
    if count > TIED_CANDIDATES * k:
        return _above_then_tied(magnitudes, threshold, k, count)
    candidates = reached.nonzero().squeeze(1)
    return candidates[magnitudes[candidates].topk(k, sorted=False).indices]


def _above_then_tied(magnitudes: torch.Tensor, threshold: torch.Tensor, k: int, reached: int) -> torch.Tensor:
    """The k largest when the threshold sits on a value many entries share (the zeros of untouched
    embedding rows): every entry above it, then as many tied ones as k needs, looked for in a prefix
    that should hold them. Choosing among the `reached` candidates instead ran a selection over most of
    the tensor, slower than one full `topk`."""
    above = (magnitudes > threshold).nonzero().squeeze(1)
    if above.numel() >= k:
        return above[magnitudes[above].topk(k, sorted=False).indices]
    need, n = k - above.numel(), magnitudes.numel()
    prefix = min(n, 2 * math.ceil(need * n / (reached - above.numel())) + SMALL_SELECTION)
    tied = (magnitudes[:prefix] == threshold).nonzero().squeeze(1)
    if tied.numel() < need:
        tied = (magnitudes == threshold).nonzero().squeeze(1)
    return torch.cat([above, tied[:need]])


class Reducer(ABC):
    """Averages a list of gradients over the team; stateful across steps (error feedback, warm starts)."""

    @abstractmethod
    def start(self, grads: list[torch.Tensor]) -> None: ...

    @abstractmethod
    def finish(self) -> list[torch.Tensor]:
        """The averaged gradients, valid until the next `start`: they may be views of buffers the
        reducer keeps across steps, so a caller copies them out (a bucket writes them into `.grad`)."""

    @property
    def wire_bytes(self) -> int:
        """Bytes this rank put on the wire in the last step (before any collective's own fan-out)."""
        return self._wire_bytes

    _wire_bytes: int = 0


class CastReducer(Reducer):
    """Plain all-reduce, optionally of a narrower copy (fp16/bf16) of the gradient."""

    def __init__(self, team: Team, *, wire_dtype: torch.dtype | None, error_feedback: bool) -> None:
        self.team = team
        self.wire_dtype = wire_dtype
        self.error_feedback = error_feedback and wire_dtype is not None
        self.error: torch.Tensor | None = None
        self.buffer = FlatBuffer()
        self._pending: tuple[torch.Tensor, Work, torch.dtype, list[torch.Size]] | None = None

    def start(self, grads: list[torch.Tensor]) -> None:
        flat = self.buffer.flatten(grads)
        if self.error is not None:
            flat.add_(self.error)
        # Dividing first keeps a narrow sum from overflowing.
        if self.wire_dtype is None:
            payload = flat.div_(self.team.size)
        else:
            payload = (flat / self.team.size).to(self.wire_dtype)
            if self.error_feedback:
                self.error = flat - payload.to(flat.dtype) * self.team.size
        self._wire_bytes = payload.numel() * payload.element_size()
        self._pending = (payload, self.team.all_reduce(payload, async_op=True), flat.dtype, [g.shape for g in grads])

    def finish(self) -> list[torch.Tensor]:
        if self._pending is None:
            raise RuntimeError("finish() before start()")
        payload, work, dtype, shapes = self._pending
        self._pending = None
        wait(work)
        return unflatten(payload.to(dtype), shapes)


class TopKReducer(Reducer):
    """Each rank keeps its k largest-magnitude entries; values and indices are all-gathered, then summed."""

    def __init__(self, team: Team, *, ratio: float, error_feedback: bool) -> None:
        self.team = team
        self.ratio = ratio
        self.error_feedback = error_feedback
        self.error: torch.Tensor | None = None
        self._pending: (
            tuple[list[torch.Tensor], Work, tuple[torch.Tensor, torch.Tensor], torch.Tensor, list[torch.Size]] | None
        ) = None

    def start(self, grads: list[torch.Tensor]) -> None:
        flat = flatten(grads)
        if self.error is not None:
            flat = flat + self.error
        k = max(1, math.ceil(self.ratio * flat.numel()))
        idx = select_largest(flat.abs(), k)
        vals = flat[idx]
        if self.error_feedback:
            self.error = flat.clone()
            self.error[idx] = 0
        wire_idx = idx.to(torch.int32) if flat.numel() <= INT32_LIMIT else idx
        # Values and indices travel as the bytes of one tensor: one all-gather, so one latency, per step.
        payload = torch.cat([vals.view(torch.uint8), wire_idx.view(torch.uint8)])
        self._wire_bytes = payload.numel()
        gathered, work = self.team.all_gather(payload, async_op=True)
        self._pending = (gathered, work, (vals, wire_idx), torch.zeros_like(flat), [g.shape for g in grads])

    def finish(self) -> list[torch.Tensor]:
        if self._pending is None:
            raise RuntimeError("finish() before start()")
        gathered, work, (vals, wire_idx), out, shapes = self._pending
        self._pending = None
        wait(work)
        split = vals.numel() * vals.element_size()
        all_vals = torch.cat([g[:split] for g in gathered]).view(vals.dtype)
        all_idx = torch.cat([g[split:] for g in gathered]).view(wire_idx.dtype)
        out.index_add_(0, all_idx, all_vals)
        return unflatten(out / self.team.size, shapes)


class PowerSGDReducer(Reducer):
    """Vogels et al. 2019: each matrix M travels as P = MQ and Q' = MᵀP̂ (rank r), Q warm-started across steps.

    Tensors with two or more dimensions are viewed as (dim 0, rest) matrices; vectors, and matrices
    too small for rank r to save anything, are all-reduced uncompressed.

    Q is kept transposed (r x cols, contiguous) and Q'ᵀ is computed as P̂ᵀM, the same numbers in the
    layouts a BLAS serves fastest: on a CPU, MᵀP reads M across its rows and took 5-9x as long as P̂ᵀM
    (a 2048 x 2048 gradient: 22 ms against 3), and M times a contiguous (cols x r) Q 3-5x as long as M
    times the transposed view of a contiguous Qᵀ (`benchmarks/cpu_rank_settings.py`).
    """

    def __init__(self, team: Team, *, rank: int, error_feedback: bool, seed: int) -> None:
        self.team = team
        self.rank = rank
        self.error_feedback = error_feedback
        self.seed = seed
        self.qts: dict[int, torch.Tensor] = {}
        """Per matrix, Qᵀ (r x cols) of the last step: the warm start."""
        self.errors: dict[int, torch.Tensor] = {}
        """Per matrix, what compression dropped last step; one buffer kept across steps, which holds
        gradient + error from `start` until `finish` subtracts the approximation."""
        self.approximations: dict[int, FlatBuffer] = {}
        """Per matrix, the buffer P·Qᵀ is written into (the bucket copies it out within the step)."""
        self._pending: dict | None = None

    def _compressible(self, g: torch.Tensor) -> bool:
        if g.dim() < 2:
            return False
        n, m = g.shape[0], g.numel() // g.shape[0]
        r = min(self.rank, n, m)
        return (n + m) * r < n * m

    def _initial_qt(self, i: int, m: int, r: int, like: torch.Tensor) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        return torch.randn(m, r, generator=generator, dtype=like.dtype).T.contiguous().to(like.device)

    def start(self, grads: list[torch.Tensor]) -> None:
        matrices = [i for i, g in enumerate(grads) if self._compressible(g)]
        plain = [i for i, g in enumerate(grads) if i not in set(matrices)]
        ms, ps = {}, []
        for i in matrices:
            m = grads[i].reshape(grads[i].shape[0], -1)
            if i in self.errors:
                m = self.errors[i].add_(m)
            r = min(self.rank, m.shape[0], m.shape[1])
            if i not in self.qts:
                self.qts[i] = self._initial_qt(i, m.shape[1], r, m)
            ms[i] = m
            ps.append(m @ self.qts[i].T)
        p_size = sum(p.numel() for p in ps)
        # The vectors ride in P's collective: one latency where a second all-reduce would pay its own.
        first = flatten(ps + [grads[i] for i in plain]) if grads else torch.empty(0)
        first[p_size:].div_(self.team.size)
        self._wire_bytes = first.numel() * first.element_size()
        self._pending = {
            "shapes": [g.shape for g in grads],
            "ms": ms,
            "p_shapes": [p.shape for p in ps],
            "plain": plain,
            "first": (first, p_size, self.team.all_reduce(first, async_op=True) if grads else None),
        }

    def finish(self) -> list[torch.Tensor]:
        if self._pending is None:
            raise RuntimeError("finish() before start()")
        pending, self._pending = self._pending, None
        out: list[torch.Tensor | None] = [None] * len(pending["shapes"])
        first, p_size, work = pending["first"]
        wait(work)
        if p_size:
            self._finish_matrices(pending, first[:p_size], out)
        if pending["plain"]:
            for i, part in zip(
                pending["plain"],
                unflatten(first[p_size:], [pending["shapes"][i] for i in pending["plain"]]),
                strict=True,
            ):
                out[i] = part
        return [t for t in out if t is not None]

    def _finish_matrices(self, pending: dict, p_flat: torch.Tensor, out: list[torch.Tensor | None]) -> None:
        indices = list(pending["ms"])
        ps = [torch.linalg.qr(p, mode="reduced").Q for p in unflatten(p_flat, pending["p_shapes"])]
        qts = [p.T @ pending["ms"][i] for i, p in zip(indices, ps, strict=True)]
        qt_flat = torch.cat([qt.reshape(-1) for qt in qts])
        wait(self.team.all_reduce(qt_flat))
        self._wire_bytes += qt_flat.numel() * qt_flat.element_size()
        qt_flat /= self.team.size
        for i, p, qt in zip(indices, ps, unflatten(qt_flat, [qt.shape for qt in qts]), strict=True):
            m = pending["ms"][i]
            kept = self.approximations.setdefault(i, FlatBuffer()).empty(m.numel(), m).view(m.shape)
            approx = torch.matmul(p, qt, out=kept)
            if self.error_feedback:
                kept_error = self.errors.get(i)
                self.errors[i] = m.sub_(approx) if kept_error is not None and m is kept_error else m - approx
            self.qts[i] = qt.clone()
            out[i] = approx.view(pending["shapes"][i])


def apply_compression(
    compressor: Compressor, *, team: Team, what: str, seed: int, probe_device: torch.device | None = None
) -> Reducer:
    """The reducer a bucket uses for its compressor; `what` names the bucket's variables in errors."""
    if compressor.kind in WIRE_DTYPES:
        dtype = WIRE_DTYPES[compressor.kind]
        if team.size > 1:
            _probe(team, dtype, what=what, device=probe_device)
        return CastReducer(team, wire_dtype=dtype, error_feedback=compressor.error_feedback)
    if compressor.kind == "topk":
        assert compressor.ratio is not None  # the IR requires it for topk
        return TopKReducer(team, ratio=compressor.ratio, error_feedback=compressor.error_feedback)
    if compressor.kind == "powersgd":
        assert compressor.rank is not None  # the IR requires it for powersgd
        return PowerSGDReducer(team, rank=compressor.rank, error_feedback=compressor.error_feedback, seed=seed)
    return CastReducer(team, wire_dtype=None, error_feedback=False)


def _probe(team: Team, dtype: torch.dtype, *, what: str, device: torch.device | None) -> None:
    """Refuse, before training, a narrow all-reduce the backend cannot do (e.g. bf16 on some gloo builds)."""
    try:
        team.all_reduce(torch.zeros(1, dtype=dtype, device=device))
    except (RuntimeError, TypeError, ValueError) as error:
        raise UnsupportedStrategyError(
            f"{what}: this process group's backend cannot all-reduce {dtype} ({error})"
        ) from None
