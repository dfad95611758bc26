"""Async tensor parallelism and fp8 FSDP gathers, end to end: the layout and strategy state them (with their
rules), the simulator prices what they overlap and halve, and the runtime refuses what it cannot run."""

from __future__ import annotations

import pytest
from layout_helpers import gpt_graph, gpu_cluster, llama_graph
from torch import nn

import stratagem
from stratagem import InvalidLayoutError, Layout, UnsupportedStrategyError
from stratagem.errors import InvalidStrategyError
from stratagem.runtime.distribute import refuse_unrunnable
from stratagem.runtime.precision import async_tensor_parallel_refusal


def test_the_short_form_states_both_knobs_and_reads_back() -> None:
    layout = Layout.from_string("tp=8,sp,async_tp,zero=3,precision=fp8,fp8_ag")
    assert layout.async_tensor_parallel and layout.fp8_all_gather
    assert Layout.from_string(str(layout)) == layout
    assert "async_tp=true" in str(layout) and "fp8_ag=true" in str(layout)


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ("tp=8,async_tp", "async_tensor_parallel", "needs sequence_parallel"),
        ("zero=3,precision=amp-bf16,fp8_ag", "fp8_all_gather", "needs precision fp8 and zero 3"),
        ("zero=1,precision=fp8,fp8_ag", "fp8_all_gather", "zero is 1"),
    ],
)
def test_a_knob_without_what_it_acts_on_is_refused_with_the_reason(text: str, field: str, reason: str) -> None:
    with pytest.raises(InvalidLayoutError) as error:
        Layout.from_string(text)
    assert f"{field}: " in str(error.value) and reason in str(error.value)


def test_a_layouts_strategy_carries_both_knobs_and_reads_back_as_the_layout() -> None:
    graph, cluster = llama_graph(), gpu_cluster(2, 8)
    layout = Layout.from_string("tp=2,sp,async_tp,zero=3,precision=fp8,fp8_ag")
    strategy = layout.build(graph, cluster)
    assert strategy.async_tensor_parallel and strategy.fp8_all_gather
    back = strategy.layout(graph)
    assert back.async_tensor_parallel and back.fp8_all_gather


def test_a_strategy_with_fp8_gathers_but_no_fsdp_is_invalid() -> None:
    graph, cluster = llama_graph(), gpu_cluster(1, 8)
    strategy = Layout.from_string("zero=3,precision=fp8").build(graph, cluster)
    with pytest.raises(InvalidStrategyError, match="fp8_all_gather: needs ZeRO stage 3"):
        strategy.replace(fp8_all_gather=True, variables=Layout(zero=1).build(graph, cluster).variables)


def test_async_tp_hides_tensor_parallel_collectives_but_never_below_one_piece() -> None:
    graph, cluster = gpt_graph(layers=4, batch=8, hidden=1024, seq=512), gpu_cluster(1, 8, device="H100")
    plain = stratagem.predict(graph, cluster, Layout.from_string("tp=4,sp,zero=3,precision=amp-bf16"))
    pieced = stratagem.predict(graph, cluster, Layout.from_string("tp=4,sp,async_tp,zero=3,precision=amp-bf16"))
    exposed, hidden = plain.breakdown["tensor_parallel"], pieced.breakdown["tensor_parallel"]
    assert 0 < hidden < exposed
    assert hidden >= exposed / 4 * 0.99
    assert pieced.step_time_s < plain.step_time_s


def test_fp8_gathers_halve_what_fsdp_gathers_of_the_linear_weights() -> None:
    graph, cluster = gpt_graph(layers=4, batch=2, hidden=1024, seq=256), gpu_cluster(2, 8, device="H100")
    from simulator.api import context_for
    from simulator.fsdp import fp8_weights

    context = context_for(graph, cluster)
    weights = fp8_weights(context)
    names = [n for n, w in zip(context.variable_names, weights, strict=True) if w]
    assert names and all(n.endswith("weight") for n in names)
    assert not any("norm" in n or n.endswith("bias") for n in names)
    bf16 = stratagem.predict(graph, cluster, Layout.from_string("zero=3,precision=fp8"))
    fp8 = stratagem.predict(graph, cluster, Layout.from_string("zero=3,precision=fp8,fp8_ag"))
    assert fp8.breakdown["sharded"] < bf16.breakdown["sharded"]
    assert fp8.memory_per_device_bytes <= bf16.memory_per_device_bytes


def test_the_cpu_runtime_refuses_async_tp_naming_what_it_needs() -> None:
    graph = llama_graph()
    cluster = stratagem.ResourceSpec(nodes=[{"address": "h", "cpus": [0, 1, 2, 3], "device": "CPU"}])
    strategy = Layout.from_string("tp=2,sp,async_tp,zero=3,precision=amp-bf16").build(graph, cluster)
    with pytest.raises(UnsupportedStrategyError, match="symmetric memory"):
        refuse_unrunnable(strategy)
    assert "torch.compile" in (async_tensor_parallel_refusal(strategy, "GPU") or "")


def test_fp8_gathers_wrap_the_converted_linears_weights_for_fsdp() -> None:
    from stratagem.runtime.precision import convert_fp8

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    converted = convert_fp8(model, fp8_all_gather=True)
    assert converted == ["0"]
    assert model[0].config.enable_fsdp_float8_all_gather
    assert type(model[0].weight).__name__ == "WeightWithDynamicFloat8CastTensor"
    assert isinstance(model[2], nn.Linear) and type(model[2].weight) is nn.Parameter
    assert tuple(model[0].weight.shape) == (64, 32)
