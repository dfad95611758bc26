"""ReplayWorkload's synthetic module reproduces the graph's variables, gradients and recorded work."""

from __future__ import annotations

import pytest
import torch
from sample_documents import make_awkward_graph, make_embedding_graph, make_mlp_graph
from torch.utils.flop_counter import FlopCounterMode

from stratagem.errors import InvalidGraphError
from stratagem.ir import ModelGraph
from trial_runner.replay import ReplayModel, replay_batch_maker, replay_loss


def _step(model: ReplayModel, graph: ModelGraph) -> list[str]:
    """One forward/backward; returns parameter names in the order their gradients became ready."""
    ready: list[str] = []
    handles = [
        p.register_post_accumulate_grad_hook(lambda _p, n=name: ready.append(n))
        for name, p in model.named_parameters()
        if p.requires_grad
    ]
    replay_loss(model(*replay_batch_maker(graph)(graph.batch_size))).backward()
    for handle in handles:
        handle.remove()
    return ready


@pytest.mark.parametrize("make", [make_mlp_graph, make_embedding_graph, make_awkward_graph])
def test_parameter_names_and_shapes_equal_the_graph_variables(make):
    graph = make()
    model = ReplayModel(graph)
    params = dict(model.named_parameters())
    assert sorted(params) == sorted(v.name for v in graph.variables)
    for variable in graph.variables:
        assert list(params[variable.name].shape) == variable.shape
        assert params[variable.name].requires_grad == variable.trainable


@pytest.mark.parametrize("make", [make_mlp_graph, make_embedding_graph, make_awkward_graph])
def test_every_trainable_variable_gets_a_gradient_and_frozen_ones_none(make):
    graph = make()
    model = ReplayModel(graph)
    _step(model, graph)
    for variable in graph.variables:
        grad = dict(model.named_parameters())[variable.name].grad
        assert (grad is not None) == variable.trainable, variable.name


def test_gradients_become_ready_in_backward_order_of_the_layers():
    graph = make_mlp_graph()
    ready = _step(ReplayModel(graph), graph)
    layer_of = {name: i for i, layer in enumerate(graph.layers) for name in layer.variables}
    positions = [layer_of[name] for name in ready]
    assert positions == sorted(positions, reverse=True)
    assert set(ready) == {v.name for v in graph.trainable_variables}


def test_sparse_variable_gets_a_sparse_gradient_of_the_recorded_lookups():
    graph = make_embedding_graph(batch_size=16, rows=5000, fields=4)
    model = ReplayModel(graph)
    _step(model, graph)
    grad = dict(model.named_parameters())["embedding.weight"].grad
    assert grad is not None and grad.is_sparse
    assert grad.coalesce()._nnz() <= 16 * 4
    assert grad._nnz() == 16 * 4  # one gradient row per lookup before coalescing, repeats included


@pytest.mark.parametrize("fwd,bwd", [(2.5e9, 5.0e9), (5.0e6, 1.0e7)])
def test_replayed_flops_match_the_recorded_flops(fwd, bwd):
    graph = ModelGraph(
        batch_size=4,
        layers=[{"name": "big", "fwd_flops": fwd, "bwd_flops": bwd, "variables": ["big.w"]}],
        variables=[{"name": "big.w", "shape": [8, 8]}],
    )
    model = ReplayModel(graph)
    batch = replay_batch_maker(graph)(4)
    with FlopCounterMode(display=False) as forward:
        loss = replay_loss(model(*batch))
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    assert forward.get_total_flops() == pytest.approx(fwd, rel=0.03)
    assert backward.get_total_flops() == pytest.approx(bwd, rel=0.03)


def test_work_scales_with_the_rows_fed_so_micro_batches_cost_their_share():
    graph = ModelGraph(
        batch_size=8,
        layers=[{"name": "l", "fwd_flops": 4e9, "variables": ["l.w"]}],
        variables=[{"name": "l.w", "shape": [4]}],
    )
    model = ReplayModel(graph)
    with FlopCounterMode(display=False) as counter:
        model(*replay_batch_maker(graph)(2))
    assert counter.get_total_flops() == pytest.approx(1e9, rel=0.03)


def test_activation_bytes_are_held_until_backward():
    graph = ModelGraph(
        batch_size=2,
        layers=[{"name": "l", "activation_bytes": 64e6, "variables": ["l.w"]}],
        variables=[{"name": "l.w", "shape": [4]}],
    )
    model = ReplayModel(graph)
    output = model(*replay_batch_maker(graph)(2))
    work = output.grad_fn  # the layer's _Work node, which is also its autograd context
    assert work.activation.numel() * work.activation.element_size() == pytest.approx(64e6, rel=1e-6)
    replay_loss(output).backward()
    assert work.activation is None


def test_a_lookup_layer_burns_its_recorded_bytes_less_what_its_real_lookups_moved():
    graph = ModelGraph(
        batch_size=16,
        layers=[{"name": "emb", "kind": "embedding", "bytes_moved": 1e6, "variables": ["emb.weight"]}],
        variables=[{"name": "emb.weight", "shape": [5000, 32], "sparse": True, "lookups_per_step": 64}],
    )
    output = ReplayModel(graph)(*replay_batch_maker(graph)(16))
    indices, rows = 16 * 4 * 8, 16 * 4 * 32 * 4  # four int64 lookups per sample, each a row of 32 floats
    assert output.grad_fn.cost.bytes_moved == 1e6 - (indices + 2 * rows)


def test_variable_names_torch_cannot_hold_are_refused_with_their_path():
    graph = ModelGraph(
        batch_size=1,
        layers=[{"name": "l", "variables": ["a", "a.b"]}],
        variables=[{"name": "a", "shape": [2]}, {"name": "a.b", "shape": [2]}],
    )
    with pytest.raises(InvalidGraphError, match=r"variables\[1\]\.name"):
        ReplayModel(graph)


def test_sparse_embeddings_are_real_sparse_embedding_modules_as_the_runtime_sees_them():
    from stratagem.runtime.plan import sparse_parameter_names

    graph = make_embedding_graph(batch_size=4, rows=100)
    model = ReplayModel(graph)
    assert sparse_parameter_names(model) == {"embedding.weight"}


def test_an_optimizer_that_cannot_apply_sparse_gradients_is_refused_naming_the_variable():
    from stratagem.errors import InvalidDocumentError
    from trial_runner.build import make_optimizer

    model = ReplayModel(make_embedding_graph(batch_size=4, rows=100))
    with pytest.raises(
        InvalidDocumentError,
        match=r"workload\.optimizer: rmsprop cannot apply the sparse gradient of 'embedding\.weight'",
    ):
        make_optimizer("rmsprop", model)
    assert isinstance(make_optimizer("adagrad", model), torch.optim.Adagrad)
