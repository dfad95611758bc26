"""One rank, in-process: every executor's bookkeeping (masters, clones, hooks, stats) trains exactly.

With a single rank every collective is trivial, so these fast checks isolate the runtime's own
arithmetic: server master copies, per-shard optimizer clones, ZeRO slices, the hidden-gradient
local step, learning-rate schedulers reaching the clones, and the step statistics.
"""

from __future__ import annotations

import pytest
import torch
from runtime_helpers import make_batches, make_model, make_optimizer, make_strategy, max_relative_error, train

from stratagem.errors import UnsupportedStrategyError
from stratagem.runtime import DistributedOptimizer, distribute
from stratagem.runtime.comm import FlatBuffer

CASES = [
    "allreduce_groups",
    "ps_single",
    "ps_partitioned",
    "sharded",
    "mixed",
    "ps_local_replication",
    "allreduce_hierarchical",
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(
    ("kind", "opt", "sparse"), [("rec", "sgd", True), ("rec", "adagrad", True), ("cnn", "adam", False)]
)
def test_each_strategy_on_one_rank_equals_plain_training(
    one_rank, case: str, kind: str, opt: str, sparse: bool
) -> None:
    batches = make_batches(kind, steps=4, batch=6)
    reference = make_model(kind, sparse=sparse)
    train(reference, make_optimizer(opt, reference.parameters()), batches)
    model = make_model(kind, sparse=sparse)
    model, optimizer = distribute(model, make_optimizer(opt, model.parameters()), make_strategy(case, model, 1))
    assert isinstance(optimizer, DistributedOptimizer)
    train(model, optimizer, batches)
    assert max_relative_error(model, reference) < 1e-6


def test_a_scheduler_on_the_returned_optimizer_reaches_server_and_shard_updates(one_rank) -> None:
    batches = make_batches("cnn", steps=6, batch=6)
    reference = make_model("cnn")
    ref_opt = make_optimizer("adam", reference.parameters())
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=2, gamma=0.1)
    model = make_model("cnn")
    model, optimizer = distribute(model, make_optimizer("adam", model.parameters()), make_strategy("mixed", model, 1))
    sched = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.1)
    for m, o, s in ((reference, ref_opt, ref_sched), (model, optimizer, sched)):
        for batch in batches:
            *inputs, y = batch
            torch.nn.functional.cross_entropy(m(*inputs), y).backward()
            o.step()
            o.zero_grad()
            s.step()
    assert max_relative_error(model, reference) < 1e-6
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * 0.1**3)


def test_step_stats_split_compute_from_waiting(one_rank) -> None:
    model = make_model("cnn")
    model, optimizer = distribute(model, make_optimizer("sgd", model.parameters()), make_strategy("mixed", model, 1))
    assert optimizer.sync_stats is None
    train(model, optimizer, make_batches("cnn", steps=3, batch=6))
    stats = optimizer.sync_stats
    assert stats is not None and stats.step == 3
    assert set(stats.wait_s) == {"allreduce", "ps", "sharded"}
    assert stats.step_s >= stats.sync_wait_s + stats.update_s - 1e-6
    assert stats.compute_s > stats.launch_s > 0
    assert stats.wire_bytes["allreduce"] > 0


def test_two_backward_passes_before_a_step_are_refused_clearly(one_rank) -> None:
    model = make_model("cnn")
    model, optimizer = distribute(
        model, make_optimizer("sgd", model.parameters()), make_strategy("allreduce_groups", model, 1)
    )
    images, y = make_batches("cnn", steps=1, batch=6)[0]
    for _ in range(2):
        torch.nn.functional.cross_entropy(model(images), y).backward()
    with pytest.raises(UnsupportedStrategyError, match="gradient accumulation"):
        optimizer.step()


@pytest.mark.parametrize("case", ["mixed", "allreduce_hierarchical", "ps_local_replication"])
def test_a_dropped_model_and_optimizer_free_the_runtime_and_its_process_groups(one_rank, case: str) -> None:
    """Gradient hooks live in C++ where the garbage collector cannot look: if they held the runtime
    strongly it would leak, process groups included, until the interpreter exits."""
    import gc
    import weakref

    from stratagem.runtime.comm import Team

    earlier = {id(o) for o in gc.get_objects() if type(o) is Team}
    model = make_model("rec", sparse=True)
    model, optimizer = distribute(model, make_optimizer("sgd", model.parameters()), make_strategy(case, model, 1))
    train(model, optimizer, make_batches("rec", steps=2, batch=6))
    teams = [weakref.ref(o) for o in gc.get_objects() if type(o) is Team and id(o) not in earlier]
    parameters = [weakref.ref(p) for p in model.parameters()]
    assert teams and parameters
    del model, optimizer
    gc.collect()
    assert [ref for ref in teams if ref() is not None] == []
    assert [ref for ref in parameters if ref() is not None] == []


def _kept_buffers(executor) -> list:
    """Every FlatBuffer an executor (or its reducer) keeps."""
    owners = [executor, getattr(executor, "reducer", None)]
    return [
        value
        for owner in owners
        if owner is not None
        for value in vars(owner).values()
        if isinstance(value, FlatBuffer)
    ]


@pytest.mark.parametrize("case", ["allreduce_groups", "ps_single", "sharded", "allreduce_hierarchical"])
def test_dense_buckets_keep_their_flat_buffers_from_step_to_step(one_rank, case: str) -> None:
    """A bucket allocated afresh every step faults its pages in every step (docs/runtime.md)."""
    model = make_model("cnn")
    model, optimizer = distribute(model, make_optimizer("adam", model.parameters()), make_strategy(case, model, 1))
    batches = make_batches("cnn", steps=3, batch=6)
    train(model, optimizer, batches[:1])
    buffers = [b for e in optimizer._readiness.executors for b in _kept_buffers(e)]
    first = [b._tensor.data_ptr() for b in buffers if b._tensor is not None]
    assert first, "no dense bucket filled a kept buffer"
    train(model, optimizer, batches[1:])
    assert [b._tensor.data_ptr() for b in buffers if b._tensor is not None] == first


def test_a_flat_buffer_is_reused_until_its_layout_changes() -> None:
    buffer = FlatBuffer()
    a = buffer.flatten([torch.ones(2, 3), torch.zeros(4)])
    assert a.tolist() == [1.0] * 6 + [0.0] * 4
    b = buffer.flatten([torch.full((5,), 2.0), torch.full((5,), 3.0)])
    assert b.data_ptr() == a.data_ptr() and b.tolist() == [2.0] * 5 + [3.0] * 5
    assert buffer.flatten([torch.ones(3)]).data_ptr() != a.data_ptr()
    assert buffer.empty(3, torch.ones(1, dtype=torch.float64)).dtype == torch.float64
