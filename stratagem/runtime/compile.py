"""`Strategy.compile`: each numbered block runs under `torch.compile`, as torchtitan's `apply_compile`
compiles each transformer block (pytorch/torchtitan `models/llama3/infra/parallelize.py`).

A block is compiled in place (`nn.Module.compile`), so its parameters keep their names and the optimizer
its references; compiling block by block keeps the graphs small and identical across blocks (one compile
serves them all). The order follows torchtitan's: after tensor parallelism and recomputation have
wrapped the blocks, before FSDP shards them. A model without numbered blocks is compiled whole. Inductor
generates Triton kernels on a GPU and C++ on a CPU (which needs a C compiler; the first steps then pay
the compile).
"""

from __future__ import annotations

from torch import nn

from stratagem.runtime.recompute import numbered_blocks


def apply_compile(model: nn.Module) -> list[str]:
    """Compile every numbered block of `model` (the model itself when it has none); return their names."""
    blocks = numbered_blocks(model)
    if not blocks:
        model.compile()
        return [""]
    for name in blocks:
        model.get_submodule(name).compile()
    return blocks
