"""Sparse embeddings with Adam: SparseAdam for the tables, Adam for the rest, through the real runtime.

Fast tests check the optimizer a trial builds and the single-process MultiOptimizer; the slow ones run
the zoo's DLRM for real (gloo, 2 ranks) under Parallax (tables on a parameter server) and under plain
data parallel (tables' rows all-gathered).
"""

from __future__ import annotations

import pytest
import torch
from sample_documents import make_cpu_cluster
from torch import nn

from stratagem import zoo
from stratagem.builders import DataParallel, Parallax
from stratagem.errors import InvalidDocumentError, StratagemError
from stratagem.runtime import MultiOptimizer
from stratagem.runtime.updates import clone_optimizer
from stratagem.tracing import capture
from trial_runner import LocalBackend, Outcome, ZooWorkload, run_trial
from trial_runner.build import make_optimizer


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(50, 4, sparse=True)
        self.head = nn.Linear(4, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.table(ids)).square().mean()


def test_adam_on_a_sparse_model_is_sparse_adam_for_the_tables_and_adam_for_the_rest() -> None:
    model = Tiny()
    optimizer = make_optimizer("adam", model, lr=0.01)
    assert isinstance(optimizer, MultiOptimizer)
    sparse_part, dense_part = optimizer.optimizers
    assert isinstance(sparse_part, torch.optim.SparseAdam) and isinstance(dense_part, torch.optim.Adam)
    assert sparse_part.param_groups[0]["params"] == [model.table.weight]
    assert {id(p) for p in dense_part.param_groups[0]["params"]} == {id(model.head.weight), id(model.head.bias)}
    assert isinstance(make_optimizer("adamw", model).optimizers[1], torch.optim.AdamW)  # type: ignore[attr-defined]
    assert isinstance(make_optimizer("adam", nn.Linear(2, 2)), torch.optim.Adam)


def test_an_optimizer_with_no_sparse_counterpart_is_still_refused_naming_the_variable() -> None:
    with pytest.raises(InvalidDocumentError, match=r"rmsprop cannot apply the sparse gradient of 'table\.weight'"):
        make_optimizer("rmsprop", Tiny())


def test_a_multi_optimizer_steps_like_its_parts_would_alone() -> None:
    torch.manual_seed(0)
    model, twin = Tiny(), Tiny()
    twin.load_state_dict(model.state_dict())
    ids = torch.tensor([1, 7, 7, 30])
    combined = MultiOptimizer(
        [torch.optim.SparseAdam([model.table.weight], lr=0.1), torch.optim.Adam(model.head.parameters(), lr=0.1)]
    )
    alone = [torch.optim.SparseAdam([twin.table.weight], lr=0.1), torch.optim.Adam(twin.head.parameters(), lr=0.1)]
    for _ in range(3):
        combined.zero_grad()
        model(ids).backward()
        combined.step()
        for part in alone:
            part.zero_grad()
        twin(ids).backward()
        for part in alone:
            part.step()
    for mine, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    assert not torch.equal(model.table.weight[0], model.table.weight[1])  # untouched rows differ from updated ones
    assert len(combined.state) == 3 and model.table.weight in combined.state
    restored = MultiOptimizer(
        [torch.optim.SparseAdam([model.table.weight], lr=0.1), torch.optim.Adam(model.head.parameters(), lr=0.1)]
    )
    restored.load_state_dict(combined.state_dict())
    assert torch.equal(restored.state[model.head.bias]["exp_avg"], combined.state[model.head.bias]["exp_avg"])


def test_server_updates_clone_the_part_that_owns_the_group() -> None:
    model = Tiny()
    optimizer = MultiOptimizer(
        [torch.optim.SparseAdam([model.table.weight], lr=0.05), torch.optim.Adam(model.head.parameters(), lr=0.2)]
    )
    table_clone = clone_optimizer(optimizer, 0, [model.table.weight.detach().clone()])
    head_clone = clone_optimizer(optimizer, 1, [model.head.weight.detach().clone()])
    assert isinstance(table_clone, torch.optim.SparseAdam) and table_clone.param_groups[0]["lr"] == 0.05
    assert type(head_clone) is torch.optim.Adam and head_clone.param_groups[0]["lr"] == 0.2


def test_a_multi_optimizer_refuses_shared_parameters_and_late_groups_clearly() -> None:
    model = Tiny()
    with pytest.raises(StratagemError, match=r"in both optimizers\[0\] and optimizers\[1\]"):
        MultiOptimizer([torch.optim.Adam(model.parameters()), torch.optim.SGD(model.head.parameters(), lr=0.1)])
    optimizer = MultiOptimizer([torch.optim.SparseAdam([model.table.weight])])
    with pytest.raises(StratagemError, match="add the group to one of its parts"):
        optimizer.add_param_group({"params": list(model.head.parameters())})


@pytest.mark.slow
@pytest.mark.parametrize("builder", [Parallax(), DataParallel()], ids=["Parallax", "DataParallel"])
def test_a_dlrm_trial_with_adam_ends_ok(builder) -> None:
    module, make_batch = zoo.build("dlrm", "small")
    graph = capture(module, make_batch(8), batch_size=8, optimizer="adam")
    assert any(v.sparse for v in graph.variables)
    resources = make_cpu_cluster(2)
    strategy = builder.build(graph, resources)
    result = run_trial(
        ZooWorkload("dlrm", batch_size=8, optimizer="adam"),
        resources,
        strategy,
        warmup=1,
        steps=2,
        timeout=120,
        backend=LocalBackend(),
        measure_undistributed=False,
    )
    assert result.outcome == Outcome.ok, result.error
    assert len(result.step_times_s) == 2 and result.median_s > 0
    kinds = {kind for rank in result.ranks for kind in rank.wait_by_kind_s}
    assert ("ps" in kinds) if isinstance(builder, Parallax) else (kinds <= {"allreduce"} and kinds)
