"""The models and strategies the LLM-dimension runtime tests train: Hugging Face Llama and GPT-2 from small configs, the zoo's GPT and the small nn.Sequential GPT, and strategies over them."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

STEPS, BATCH, SEQ, VOCAB = 5, 8, 8, 64


class CausalLM(nn.Module):
    """A Hugging Face causal LM trained as `loss = model(ids, labels)` (its ModelOutput's loss)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> Any:
        return self.model(input_ids=ids, labels=labels)


def build(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=SEQ,
            bos_token_id=0,
            eos_token_id=1,
        )
        return CausalLM(LlamaForCausalLM(config))
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            vocab_size=VOCAB,
            n_positions=SEQ,
            n_embd=32,
            n_layer=2,
            n_head=4,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=1,
        )
        return CausalLM(GPT2LMHeadModel(config))
    if kind.startswith("zoo-gpt"):
        from stratagem.zoo import build as zoo_build

        layers = 4 if kind == "zoo-gpt-4" else 2
        model, _ = zoo_build("gpt", "small", vocab=VOCAB, seq=SEQ, hidden=32, ffn=64, layers=layers)
        return model
    from tiny_gpt import tiny_gpt

    return tiny_gpt()


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randint(0, VOCAB, (BATCH, SEQ), generator=g))
        for _ in range(STEPS)
    ]


def loss_of(kind: str, output: Any, target: torch.Tensor) -> torch.Tensor:
    """The training loss from a model's output: Hugging Face's ModelOutput.loss, the zoo's own loss,
    or cross-entropy of the small GPT's logits."""
    if kind in ("llama", "gpt2"):
        return output.loss
    if kind.startswith("zoo-gpt"):
        return output
    return sequential_loss(output, target)


def sequential_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def inputs_of(kind: str, ids: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (ids,) if kind == "sequential" else (ids, target)


def make_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def train_alone(kind: str) -> tuple[dict[str, torch.Tensor], list[float]]:
    model = build(kind)
    optimizer = make_optimizer(model.parameters())
    losses = []
    for ids, target in batches():
        loss = loss_of(kind, model(*inputs_of(kind, ids, target)), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return {n: p.detach().clone() for n, p in model.named_parameters()}, losses


def strategy(
    kind: str,
    *,
    data: int,
    tensor: int = 1,
    pipeline: dict[str, Any] | None = None,
    sync: Any = None,
    **fields: Any,
) -> dict[str, Any]:
    """A strategy over `data × pipeline × tensor` ranks, tensor innermost on one node; `sync(index, name)`
    gives each variable's synchronizer (all-reduce by default)."""
    model = build(kind)
    stages = pipeline["stages"] if pipeline else []
    chunks = len(stages) // pipeline.get("virtual_stages", 1) if pipeline else 1
    world = data * tensor * chunks
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    variables = [
        {"var_name": name, "synchronizer": (sync(i, name) if sync else None) or {"kind": "allreduce", "group": i // 4}}
        for i, name in enumerate(names)
    ]
    out: dict[str, Any] = {
        "replicas": [f"10.0.0.{r // tensor + 1}:CPU:{r % tensor}" for r in range(world)],
        "mesh": {"data": data, "tensor": tensor, "pipeline": chunks},
        "variables": variables,
        **fields,
    }
    if pipeline:
        out["pipeline"] = pipeline
    if tensor > 1:
        from tiny_gpt import split_plan

        out["tensor_parallel"] = split_plan()
    return out


def stage3(group: int | None = None) -> Any:
    def sync(_: int, __: str) -> dict[str, Any]:
        return {"kind": "sharded", "stage": 3, "shard_group": group}

    return sync


def sequential_pipeline(schedule: str, micro_batches: int) -> dict[str, Any]:
    """The small GPT's four children as four chunks on two pipeline ranks."""
    return {
        "stages": [["0"], ["1"], ["2"], ["3"]],
        "micro_batches": micro_batches,
        "schedule": schedule,
        "virtual_stages": 2,
    }


def zoo_pipeline(schedule: str, micro_batches: int) -> dict[str, Any]:
    """The zoo GPT's four blocks as four chunks (cut at the beginning of blocks) on two pipeline ranks."""
    return {
        "stages": [["embed", "positions", "blocks.0"], ["blocks.1"], ["blocks.2"], ["blocks.3", "final_norm", "head"]],
        "micro_batches": micro_batches,
        "schedule": schedule,
        "virtual_stages": 2,
    }
