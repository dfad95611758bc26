"""Precision, recomputation and the LLM-dimension refusals, in this process (one gloo rank or none).

What needs several ranks is `test_runtime_llm_dimensions.py`; here: what each precision does to the
model and its steps, that an overflowed fp16 step changes nothing anywhere, that selective
recomputation repeats the attention core and nothing else, and that what cannot run on these devices
is refused before any collective with the reason (context parallelism of a model whose attention it cannot reach, a
sequence that does not split into two chunks per context rank). The fp8 test runs only on a GPU with fp8 tensor
cores and torchao (a lent H100); elsewhere its refusal is what is tested.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from runtime_helpers import make_batches, make_model, make_strategy, replicas
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from stratagem.errors import UnsupportedStrategyError
from stratagem.ir import Strategy
from stratagem.runtime import distribute


def whole(model: nn.Module, **fields: Any) -> Strategy:
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    return Strategy.parse(
        {
            "replicas": replicas(1),
            "variables": [{"var_name": n, "synchronizer": {"kind": "allreduce"}} for n in names],
            **fields,
        }
    )


def cnn_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: tuple) -> float:
    images, y = batch
    loss = F.cross_entropy(model(images), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return float(loss.detach())


# --- refusals before any collective -----------------------------------------------------------------


def test_fp8_is_refused_on_a_cpu_replica_because_it_needs_fp8_tensor_cores(one_rank) -> None:
    model = make_model("cnn")
    with pytest.raises(UnsupportedStrategyError, match=r"precision 'fp8' runs fp8 matmuls on tensor cores.*8\.9"):
        distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), whole(model, precision="fp8"))


def test_an_fp16_model_with_fp32_master_weights_is_refused_and_pointed_to_the_engines(one_rank) -> None:
    model = make_model("cnn")
    with pytest.raises(UnsupportedStrategyError, match=r"precision 'fp16'.*master weights.*DeepSpeed or Megatron-LM"):
        distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), whole(model, precision="fp16"))


def context_strategy(model: nn.Module, pipeline: dict[str, Any] | None = None) -> Strategy:
    """Context 2 (times the pipeline's stages) over all-reduced variables."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    stages = len(pipeline["stages"]) if pipeline else 1
    return Strategy.parse(
        {
            "replicas": [f"10.0.0.1:CPU:{i}" for i in range(2 * stages)],
            "mesh": {"data": 1, "context": 2, "pipeline": stages},
            "variables": [{"var_name": n, "synchronizer": {"kind": "allreduce"}} for n in names],
            **({"pipeline": pipeline} if pipeline else {}),
        }
    )


def test_context_parallelism_refuses_a_model_whose_attention_it_cannot_reach(one_rank) -> None:
    model = make_model("cnn")
    with pytest.raises(
        UnsupportedStrategyError, match=r"mesh\.context: CNN holds no attention context parallelism can reach"
    ):
        distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), context_strategy(model))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.attn(x, x, x)[0]

    encoder = Encoder()
    with pytest.raises(UnsupportedStrategyError, match="computes attention in MultiheadAttention"):
        distribute(encoder, torch.optim.SGD(encoder.parameters(), lr=0.1), context_strategy(encoder))


def test_context_parallelism_with_pipeline_stages_is_refused(one_rank) -> None:
    from llm_cases import build

    model = build("zoo-gpt")
    stages = {"stages": [["embed", "positions", "blocks.0"], ["blocks.1", "final_norm", "head"]], "micro_batches": 2}
    with pytest.raises(UnsupportedStrategyError, match=r"mesh.context \(2\) with mesh.pipeline \(2\)"):
        distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), context_strategy(model, pipeline=stages))


def test_a_sequence_that_does_not_split_into_two_chunks_per_context_rank_is_refused() -> None:
    from llm_cases import build

    from stratagem.runtime import context_shard

    plan = context_strategy(build("zoo-gpt"))
    with pytest.raises(UnsupportedStrategyError, match=r"mesh.context \(2\).*6 positions.*4 equal chunks"):
        context_shard(plan, 0, torch.arange(12).view(2, 6))
    (piece,) = context_shard(plan, 1, torch.arange(16).view(2, 8))
    assert piece.tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]


def test_amp_fp16_with_error_feedback_compression_is_refused(one_rank) -> None:
    model = make_model("cnn")
    names = [n for n, _ in model.named_parameters()]
    strategy = Strategy.parse(
        {
            "replicas": replicas(1),
            "precision": "amp-fp16",
            "variables": [
                {"var_name": n, "synchronizer": {"kind": "allreduce", "compressor": {"kind": "fp16"}}} for n in names
            ],
        }
    )
    with pytest.raises(UnsupportedStrategyError, match="would leave inf in the error buffer"):
        distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), strategy)


def test_a_traced_pipeline_refuses_multi_chunk_schedules_whose_chunks_talk_only_to_neighbours() -> None:
    from llm_cases import build, strategy, zoo_pipeline

    from stratagem.runtime.hybrid import _block_cuts

    plan = Strategy.parse(strategy("zoo-gpt-4", data=1, pipeline=zoo_pipeline("interleaved-1f1b", 2)))
    with pytest.raises(UnsupportedStrategyError, match=r"sends its own inputs \(the labels\) from the first chunk"):
        _block_cuts(plan, build("zoo-gpt-4"))


def test_zero3_in_a_traced_pipeline_is_refused_before_any_collective() -> None:
    from llm_cases import build, stage3, strategy, zoo_pipeline

    from stratagem.runtime.hybrid import _check

    pipeline = {**zoo_pipeline("1f1b", 2), "stages": [["embed", "blocks.0", "blocks.1"], ["blocks.2", "blocks.3"]]}
    pipeline["virtual_stages"] = 1
    plan = Strategy.parse(strategy("zoo-gpt-4", data=1, pipeline=pipeline, sync=stage3()))
    with pytest.raises(UnsupportedStrategyError, match=r"ZeRO stage 3 \(FSDP2\) in a pipeline cut between the blocks"):
        _check(
            plan, build("zoo-gpt-4"), world_size=2, loss_fn=None, needs_loss_fn=False, fully_sharded={"x"}, traced=True
        )


def test_sequence_parallelism_refuses_an_unsplit_linear_inside_a_transformer_block() -> None:
    from runtime_helpers import FakeMesh
    from tiny_gpt import HEADS, tiny_gpt

    from stratagem.ir import TensorParallelLayer
    from stratagem.runtime.tensor_parallel import apply_tensor_parallel

    layers = [TensorParallelLayer(name=f"{b}.attn", style="heads", heads=HEADS) for b in ("1", "2")]
    with pytest.raises(UnsupportedStrategyError, match=r"sequence_parallel \(1\.fc\): a Linear with parameters"):
        apply_tensor_parallel(tiny_gpt(), FakeMesh(2), layers, sequence_parallel=True)  # type: ignore[arg-type]


# --- recomputation ------------------------------------------------------------------------------------


class CountOps(TorchDispatchMode):
    """Counts the aten operators that run (backward's recomputation included)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = func.overloadpacket.__name__
        self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def test_selective_recomputation_repeats_the_attention_core_and_nothing_else() -> None:
    from stratagem.runtime.recompute import apply_recomputation
    from stratagem.zoo import build

    torch.manual_seed(0)
    model, make_batch = build("gpt", "small")
    reference = copy.deepcopy(model)
    apply_recomputation(model, "selective")
    batch = make_batch(4)
    reference(*batch).backward()
    loss = model(*batch)
    with CountOps() as backward:
        loss.backward()
    layers = len(model.blocks)
    assert backward.calls.get("_scaled_dot_product_flash_attention_for_cpu") == layers, backward.calls
    assert "addmm" not in backward.calls, "a projection's forward ran again in backward"
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), name


# --- precision ------------------------------------------------------------------------------------------


def test_tf32_on_a_cpu_trains_exactly_as_fp32(one_rank) -> None:
    batches = make_batches("cnn", steps=2, batch=8)
    results = []
    for precision in ("fp32", "tf32"):
        model = make_model("cnn")
        model, optimizer = distribute(
            model, torch.optim.SGD(model.parameters(), lr=0.1), whole(model, precision=precision)
        )
        for batch in batches:
            cnn_step(model, optimizer, batch)
        results.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


def test_bf16_puts_the_model_in_bf16_and_amp_keeps_fp32_parameters_with_fp32_outputs(one_rank) -> None:
    images, _ = make_batches("cnn", steps=1, batch=4)[0]
    bf16 = make_model("cnn")
    bf16, _ = distribute(bf16, torch.optim.SGD(bf16.parameters(), lr=0.1), whole(bf16, precision="bf16"))
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    assert bf16(images).dtype == torch.float32
    amp = make_model("cnn")
    amp, _ = distribute(amp, torch.optim.SGD(amp.parameters(), lr=0.1), whole(amp, precision="amp-bf16"))
    assert {p.dtype for p in amp.parameters()} == {torch.float32}
    assert amp(images).dtype == torch.float32


class Summed(nn.Module):
    """Four weights, each used on its own, so each gradient is the same constant (2 per element)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Parameter(torch.ones(4, 2)) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(((x @ w).sum() for w in (self.a, self.b, self.c, self.d)), torch.zeros((), dtype=x.dtype))


@pytest.mark.parametrize("case", ["mixed", "fsdp"])
def test_bf16_steps_fp32_master_weights_so_updates_below_its_resolution_add_up(one_rank, case: str) -> None:
    """SGD at 5e-4 with gradient 2 moves 1.0 by 1e-3 a step, under half a bf16 step below 1 (2^-9):
    a pure bf16 weight would stay 1.0 for ever. Ten steps move the fp32 masters to 0.99, whose nearest
    bf16 is what every variable reads, whether all-reduced, split across a server, ZeRO-sharded or
    served (`mixed`: one of each), or fully sharded by FSDP2."""
    model = Summed()
    optimizer = torch.optim.SGD(model.parameters(), lr=5e-4)
    if case == "mixed":
        strategy = make_strategy("mixed", model, 1, precision="bf16")
    else:
        names = [n for n, _ in model.named_parameters()]
        fsdp = [{"var_name": n, "synchronizer": {"kind": "sharded", "stage": 3}} for n in names]
        strategy = Strategy.parse({"replicas": replicas(1), "variables": fsdp, "precision": "bf16"})
    model, optimizer = distribute(model, optimizer, strategy)
    x = torch.ones(2, 4)
    for _ in range(10):
        model(x).backward()
        optimizer.step()
        optimizer.zero_grad()
    expected = torch.tensor(0.99).to(torch.bfloat16)
    for name, p in model.named_parameters():
        assert hasattr(p, "full_tensor") == (case == "fsdp")
        value = p.detach().full_tensor() if case == "fsdp" else p.detach()
        assert value.dtype == torch.bfloat16
        assert torch.equal(value, torch.full_like(value, expected)), name


def test_an_overflowed_fp16_step_changes_nothing_anywhere_and_halves_the_scale(one_rank) -> None:
    """All-reduce, ZeRO and parameter-server variables together (the `mixed` case): each kind skips."""
    batches = make_batches("cnn", steps=2, batch=8)
    model = make_model("cnn")
    strategy = make_strategy("mixed", model, 1, precision="amp-fp16")
    model, optimizer = distribute(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), strategy)
    scaler = optimizer.scaler
    assert scaler is not None and scaler.scale == 2.0**16
    before = [p.detach().clone() for p in model.parameters()]
    scaler.scale = 1e38  # the scaled gradients overflow fp16 inside the autocast region
    cnn_step(model, optimizer, batches[0])
    assert scaler.skipped == 1 and scaler.scale == 5e37
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    scaler.scale = 2.0**10
    cnn_step(model, optimizer, batches[1])
    assert scaler.skipped == 1
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_amp_fp16_steps_close_to_fp32(one_rank) -> None:
    batches = make_batches("cnn", steps=3, batch=8)
    reference = make_model("cnn")
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
    expected = [cnn_step(reference, sgd, batch) for batch in batches]
    model = make_model("cnn")
    model, optimizer = distribute(
        model, torch.optim.SGD(model.parameters(), lr=0.1), whole(model, precision="amp-fp16")
    )
    losses = [cnn_step(model, optimizer, batch) for batch in batches]
    assert losses == pytest.approx(expected, rel=1e-2)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-2, rtol=1e-2)


def test_amp_fp16_unscales_sparse_embedding_gradients_too(one_rank) -> None:
    """EmbeddingBags with sparse gradients beside dense layers, on all-reduce, ZeRO and a server."""
    model = make_model("rec")
    reference = copy.deepcopy(model)
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
    model, optimizer = distribute(
        model, torch.optim.SGD(model.parameters(), lr=0.1), make_strategy("mixed", model, 1, precision="amp-fp16")
    )
    for ids, x, y in make_batches("rec", steps=2, batch=8):
        for net, opt in ((model, optimizer), (reference, sgd)):
            F.cross_entropy(net(ids, x), y).backward()
            opt.step()
            opt.zero_grad()
    assert optimizer.scaler is not None and optimizer.scaler.skipped == 0
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-2, rtol=1e-2)


def test_fp8_converts_the_linears_whose_dimensions_fp8_matmuls_take() -> None:
    """The conversion the GPU path runs (it needs no GPU itself): Linears with dimensions that are
    multiples of 16 become torchao's Float8Linear, the others stay as they are."""
    pytest.importorskip("torchao.float8")
    from stratagem.runtime.precision import convert_fp8

    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10))
    weights = [model[0].weight, model[2].weight]
    assert convert_fp8(model) == ["0"]
    assert type(model[0]).__name__ == "Float8Linear" and type(model[2]) is nn.Linear
    assert model[0].weight is weights[0], "the optimizer's parameters must stay the module's"


def _fp8_gpu() -> bool:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        return False
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _fp8_gpu(), reason="fp8 training needs a CUDA GPU of compute capability 8.9+ and torchao")
def test_fp8_trains_on_an_fp8_gpu(one_rank) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).cuda()
    strategy = Strategy.parse(
        {
            "replicas": ["10.0.0.1:GPU:0"],
            "precision": "fp8",
            "variables": [{"var_name": n, "synchronizer": {"kind": "allreduce"}} for n, _ in model.named_parameters()],
        }
    )
    model, optimizer = distribute(model, torch.optim.AdamW(model.parameters(), lr=1e-3), strategy)
    assert any("Float8" in type(m).__name__ for m in model.modules())
    x = torch.randn(256, 64, device="cuda")
    losses = []
    for _ in range(20):
        loss = F.mse_loss(model(x), x)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    assert losses[-1] < losses[0]


def test_per_op_checkpointing_of_a_hugging_face_model_turns_its_kv_cache_off_and_keeps_its_gradients() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from stratagem.runtime.recompute import apply_recomputation

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="sdpa",
    )
    checkpointed, plain = LlamaForCausalLM(config), LlamaForCausalLM(config)
    plain.load_state_dict(checkpointed.state_dict())
    assert checkpointed.config.use_cache
    apply_recomputation(checkpointed, "selective-op")
    assert not checkpointed.config.use_cache
    ids = torch.randint(0, 64, (2, 8))
    checkpointed(input_ids=ids, labels=ids).loss.backward()
    plain(input_ids=ids, labels=ids).loss.backward()
    for (name, a), b in zip(checkpointed.named_parameters(), plain.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-6), name
