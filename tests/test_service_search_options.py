"""The request's search object states the precision, compile, a fixed global batch and the runner; the job
keeps them and hands them to the search (in-process: no server, no database)."""

from __future__ import annotations

from typing import Any

import pytest
from layout_helpers import gpu_cluster, llama_graph
from pydantic import ValidationError

from optimizer_service.core.inputs import JobOptions, OptimizeInput
from optimizer_service.jobs.search_adapter import run_search
from optimizer_service.search import search
from optimizer_service.settings import Settings


def _request(**search_options: Any) -> OptimizeInput:
    return OptimizeInput(graph=llama_graph(batch=1, seq=64), resources=gpu_cluster(1, 8), search=search_options)


def test_an_omitted_precision_is_fp32_and_nothing_else_is_fixed() -> None:
    options = JobOptions.resolve(_request(), Settings()).search
    assert (options.precision, options.allow_precision, options.global_batch, options.runner) == (
        "fp32",
        False,
        None,
        "stratagem",
    )
    assert (options.compile, options.allow_compile) == (False, False), "an omitted compile is eager, and fixed"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("precision", "fp7"),
        ("global_batch", 0),
        ("runner", "deepspeed"),
        ("allow_precision", "sometimes"),
        ("compile", "sometimes"),
        ("allow_compile", 2),
    ],
)
def test_a_bad_search_field_is_refused_by_name(field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        _request(**{field: value})
    assert any(error["loc"][-1] == field for error in caught.value.errors())


def test_an_fp16_model_is_asked_of_the_engine_runner_only() -> None:
    with pytest.raises(ValidationError, match=r"precision: 'fp16'.*runner 'engine', or amp-fp16"):
        _request(precision="fp16")
    assert JobOptions.resolve(_request(precision="fp16", runner="engine"), Settings()).search.precision == "fp16"


def test_the_job_hands_precision_compile_global_batch_and_runner_to_the_search() -> None:
    request = _request(
        precision="amp-bf16", allow_precision=False, compile=True, global_batch=32, runner="engine", max_candidates=400
    )
    options = JobOptions.resolve(request, Settings())
    seen: dict[str, Any] = {}

    def spy(graph, resources, **kwargs):  # type: ignore[no-untyped-def]
        seen.update(kwargs)
        return search(graph, resources, **{**kwargs, "time_budget_s": None})

    outcome = run_search(request.graph, request.resources, options, lambda *_: None, search=spy)
    assert (seen["precision"], seen["allow_precision"], seen["global_batch"], seen["runner"]) == (
        "amp-bf16",
        False,
        32,
        "engine",
    )
    assert (seen["compile"], seen["allow_compile"]) == (True, False)
    for strategy in outcome.candidates:
        assert strategy.precision == "amp-bf16" and strategy.compile
        assert strategy.effective_mesh.data * strategy.micro_batch_size * strategy.micro_batches == 32


def test_an_engine_runner_job_runs_no_trials_and_says_why(make_client) -> None:
    from service_helpers import fake_executor, optimize_body

    ran: list[str] = []
    client = make_client(trials=fake_executor(lambda spec: ran.append(str(spec.strategy.id)) or 0.01))
    body = optimize_body(max_trials=2)
    body["search"] = {**body["search"], "runner": "engine"}
    job = client.post("/v1/optimize", params={"wait": True, "timeout": 60}, json=body).json()
    assert job["status"] == "succeeded", job
    assert not ran
    assert any("runner 'engine'" in note for note in job["progress"]["notes"])
