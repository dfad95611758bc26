"""Stand-ins for the model's tensors.

Fake tensors carry shape, dtype and device but no storage, so capture costs what the metadata costs and
never what the weights cost: a 7-billion-parameter model captures on a laptop. Meta tensors (a model
built under `torch.device("meta")`) become fake CPU tensors so they mix with CPU example inputs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_map

from stratagem.errors import CaptureError
from stratagem.ir import DType

_DTYPES: dict[torch.dtype, DType] = {
    torch.float64: DType.float64,
    torch.float32: DType.float32,
    torch.float16: DType.float16,
    torch.bfloat16: DType.bfloat16,
    torch.int64: DType.int64,
    torch.int32: DType.int32,
    torch.int16: DType.int16,
    torch.int8: DType.int8,
    torch.uint8: DType.uint8,
    torch.bool: DType.bool,
}


def ir_dtype(dtype: torch.dtype, *, where: str) -> DType:
    """The IR's name for a torch dtype; `where` names the tensor in the error."""
    if dtype in _DTYPES:
        return _DTYPES[dtype]
    if "float8" in str(dtype):
        return DType.float8
    raise CaptureError(f"{where}: dtype {dtype} has no equivalent in the graph IR")


def _fake_device(tensor: torch.Tensor) -> torch.device:
    return torch.device("cpu") if tensor.device.type == "meta" else tensor.device


def fake_like(mode: FakeTensorMode, tensor: torch.Tensor, *, requires_grad: bool) -> torch.Tensor:
    """A fresh fake leaf with the tensor's metadata; the original (real or meta) is never read."""
    with mode:
        fake = torch.empty_strided(
            tuple(tensor.shape), tuple(tensor.stride()), dtype=tensor.dtype, device=_fake_device(tensor)
        )
    return fake.requires_grad_(requires_grad and (tensor.is_floating_point() or tensor.is_complex()))


def fake_state(mode: FakeTensorMode, model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Fake parameters and buffers by their deduplicated names, for `torch.func.functional_call`.

    Tied parameters appear once (under `named_parameters()`'s name); `functional_call(tie_weights=True)`
    points every alias at the same fake tensor.
    """
    params = {name: fake_like(mode, p, requires_grad=p.requires_grad) for name, p in model.named_parameters()}
    buffers = {name: fake_like(mode, b, requires_grad=False) for name, b in model.named_buffers()}
    return params, buffers


def fake_inputs(mode: FakeTensorMode, inputs: Any) -> Any:
    """Every tensor in a (nested) structure replaced by a fake one; other values pass through."""
    return tree_map(
        lambda x: fake_like(mode, x, requires_grad=x.requires_grad) if isinstance(x, torch.Tensor) else x, inputs
    )


def storage_key(tensor: torch.Tensor) -> int:
    """Identity of the tensor's storage: views share it, so deduplication by it counts bytes once."""
    return tensor.untyped_storage()._cdata
