"""Models outside the zoo that the trial benchmark replays: Hugging Face GPT-2, Llama and T5 from small
configs, and ResNet-18.

torchvision is not installed here (PyPI's wheel does not load beside this torch's CPU wheel), so
ResNet-18 is written out from torchvision's published architecture (`torchvision/models/resnet.py`:
a 7x7/2 stem with 3x3/2 max-pool, four stages of two BasicBlocks with 64/128/256/512 channels, a 1x1
projection with batch norm where a stage changes shape, global average pooling, a linear head; He et
al. 2016). Its parameters have torchvision's names and shapes (11.2M with 10 classes).

Each builder returns `(model, make_batch, loss_fn)`: `make_batch(b)` gives the model's keyword or
positional inputs, labels included, and `loss_fn(output)` the scalar the step trains on.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, SEQ = 512, 32
Built = tuple[nn.Module, Callable[[int], Any], Callable[[Any], torch.Tensor]]


def _hf_loss(output: Any) -> torch.Tensor:
    return output.loss


def _tokens(batch_size: int, length: int = SEQ) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch_size, length))


def _causal_batch(batch_size: int) -> dict[str, torch.Tensor]:
    """A causal language model's batch: its labels are its input ids (the model shifts them)."""
    ids = _tokens(batch_size)
    return {"input_ids": ids, "labels": ids}


def hf_gpt2() -> Built:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0
    )
    model = GPT2LMHeadModel(config)

    return model, _causal_batch, _hf_loss


def hf_llama() -> Built:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = LlamaForCausalLM(config)

    return model, _causal_batch, _hf_loss


def hf_t5() -> Built:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=VOCAB,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    model = T5ForConditionalGeneration(config)

    def make_batch(batch_size: int) -> dict[str, torch.Tensor]:
        return {"input_ids": _tokens(batch_size), "labels": _tokens(batch_size, SEQ // 2)}

    return model, make_batch, _hf_loss


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """torchvision's `resnet18(num_classes=...)`, module for module."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._stage(64, 2)
        self.layer2 = self._stage(128, 2, stride=2)
        self.layer3 = self._stage(256, 2, stride=2)
        self.layer4 = self._stage(512, 2, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def _stage(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return F.cross_entropy(self.fc(torch.flatten(self.avgpool(x), 1)), labels)


def resnet18() -> Built:
    model = ResNet18()

    def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(batch_size, 3, 64, 64), torch.randint(0, 10, (batch_size,))

    return model, make_batch, lambda loss: loss


OTHER_MODELS: dict[str, Callable[[], Built]] = {
    "hf_gpt2": hf_gpt2,
    "hf_llama": hf_llama,
    "hf_t5": hf_t5,
    "resnet18": resnet18,
}

CODE_MODULES = {
    "hf_gpt2": "transformers.models.gpt2.modeling_gpt2",
    "hf_llama": "transformers.models.llama.modeling_llama",
    "hf_t5": "transformers.models.t5.modeling_t5",
}


def import_code(name: str) -> None:
    """Load a model's code without building it (the zoo's for zoo models)."""
    importlib.import_module(CODE_MODULES.get(name, "stratagem.zoo"))
