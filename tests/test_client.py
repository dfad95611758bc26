"""The client SDK against the real service over HTTP: jobs, documents, trials, typed errors, progress."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from sample_documents import make_cpu_cluster, make_embedding_graph, make_mlp_graph, make_t4_cluster
from service_helpers import QUICK_SEARCH, closed_port_url, served

import stratagem
from stratagem.builders import BUILDERS
from stratagem.client import render_progress
from stratagem.errors import NotFoundError, RequestRejectedError, ServiceError, ServiceUnavailableError, StratagemError


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One service for the module's tests that need nothing special: one worker, no trials."""
    database = tmp_path_factory.mktemp("client") / "service.db"
    with served(f"sqlite:///{database}") as address:
        yield address


@pytest.fixture
def client(url: str) -> Iterator[stratagem.Client]:
    with stratagem.Client(url) as connection:
        yield connection


@pytest.fixture
def queue_only(tmp_path: Path) -> Iterator[str]:
    """A service with no workers: jobs stay queued, so waiting and cancelling can be observed."""
    with served(f"sqlite:///{tmp_path / 'queue.db'}", workers=0) as address:
        yield address


def test_optimize_wait_best_returns_the_rank_one_strategy_valid_for_the_documents(client: stratagem.Client) -> None:
    graph, resources = make_mlp_graph(), make_t4_cluster(2)
    job = client.optimize(graph, resources, max_trials=0, search=QUICK_SEARCH).wait(timeout=60)
    assert job.status == "succeeded" and job.done
    best = job.best()
    assert best.validate_for(graph, resources).id == job.data["best_strategy_id"]
    candidates = job.strategies()
    assert [c["rank"] for c in candidates] == list(range(1, len(candidates) + 1))
    assert candidates[0]["strategy_id"] == best.id
    assert {"AllReduce", "PS"} <= {c["source"] for c in candidates}
    assert job.decision is not None and job.decision["chosen"] == best.id  # the rule's answer, and why
    assert best.predicted is not None and job.decision["reason"] in " ".join(best.provenance.notes)
    assert job.data["options"]["max_trials"] == 0
    assert client.job(job.id).data["status"] == "succeeded"
    assert job.id in {j["id"] for j in client.jobs(status="succeeded")}


def test_optimize_prices_the_current_configuration_in_any_of_its_forms(client: stratagem.Client) -> None:
    graph, resources = make_mlp_graph(), make_t4_cluster(2)
    for current in ("dp=8", stratagem.Layout(data=8), stratagem.Layout().build(graph, resources)):
        job = client.optimize(graph, resources, max_trials=0, search=QUICK_SEARCH, current=current).wait(timeout=60)
        assert job.result["current"]["label"].startswith("dp=8") and job.speedup_vs_current is not None
        assert [c["source"] for c in job.strategies()].count("current") == 1
    with pytest.raises(StratagemError, match=r"current: expected a stratagem\.Layout"):
        client.optimize(graph, resources, current={"data": 8})  # type: ignore[arg-type]
    with pytest.raises(RequestRejectedError, match=r"body\.current\.data: tensor\(3\)"):
        client.optimize(graph, resources, current="tp=3")


def test_strategies_are_stored_and_fetchable_as_json_and_autodist_text(client: stratagem.Client) -> None:
    job = client.optimize(make_mlp_graph(batch_size=16), make_t4_cluster(2), max_trials=0, search=QUICK_SEARCH).wait(60)
    # any pre-built baseline: which ones survive deduplication against search candidates varies
    builder = next(c for c in job.strategies() if c["source"] in BUILDERS)
    stored = client.strategy(builder["strategy_id"])
    assert stored.id == builder["strategy_id"]
    assert "node_config" in client.strategy_autodist(builder["strategy_id"])


def test_documents_upload_idempotently_and_read_back(client: stratagem.Client) -> None:
    graph, resources = make_embedding_graph(), make_cpu_cluster(2)
    graph_id = client.upload_graph(graph)
    assert client.upload_graph(graph) == graph_id == graph.id
    assert client.graph(graph_id) == graph
    resource_id = client.upload_resources(resources)
    assert client.resources(resource_id).id == resource_id == resources.id


def test_an_autodist_yaml_cluster_takes_the_device_kind_given(client: stratagem.Client) -> None:
    yaml_text = (
        "nodes:\n  - address: 10.0.0.1\n    gpus: [0, 1]\n    chief: true\n  - address: 10.0.0.2\n    gpus: [0, 1]\n"
    )
    job = client.optimize(make_mlp_graph(), yaml_text, max_trials=0, search=QUICK_SEARCH, device="V100").wait(60)
    resources = client.resources(job.data["resource_id"])
    assert [node.device for node in resources.nodes] == ["V100", "V100"]
    assert len(job.best().replicas) == 4


def test_record_trial_is_listed_with_summaries_computed_by_the_service(client: stratagem.Client) -> None:
    graph, resources = make_mlp_graph(batch_size=8), make_cpu_cluster(2)
    job = client.optimize(graph, resources, max_trials=0, search=QUICK_SEARCH).wait(60)
    best = job.best()
    recorded = client.record_trial(
        best,
        graph_id=graph.id,
        resource_id=resources.id,
        step_times_s=[0.030, 0.010, 0.020],
        job_id=job.id,
        backend="my-cluster",
        simulator_version="sim-x",
    )
    assert recorded["median_s"] == pytest.approx(0.020)
    assert recorded["samples_per_s"] == pytest.approx(graph.batch_size * best.effective_mesh.data / 0.020)
    assert recorded["backend"] == "my-cluster" and recorded["simulator_version"] == "sim-x"
    listed = client.trials(job_id=job.id)
    assert [t["id"] for t in listed] == [recorded["id"]]
    assert listed[0]["strategy_id"] == best.id
    failed = client.record_trial(
        best, graph_id=graph.id, resource_id=resources.id, step_times_s=[], outcome="oom", error="CUDA out of memory"
    )
    assert failed["outcome"] == "oom" and failed["median_s"] is None
    assert {t["id"] for t in client.trials(graph_id=graph.id)} == {recorded["id"], failed["id"]}


def test_unknown_ids_raise_not_found_with_the_services_words(client: stratagem.Client) -> None:
    missing = str(uuid.UUID(int=7))
    with pytest.raises(NotFoundError) as caught:
        client.job(missing)
    assert caught.value.status == 404 and missing in str(caught.value)
    with pytest.raises(NotFoundError):
        client.strategy("0" * 64)
    with pytest.raises(NotFoundError):
        client.graph("f" * 64)


def test_invalid_input_raises_request_rejected_naming_the_field(client: stratagem.Client) -> None:
    bad_yaml = "nodes:\n  - address: 10.0.0.1\n    gpu: [0]\n"
    with pytest.raises(RequestRejectedError) as caught:
        client.optimize(make_mlp_graph(), bad_yaml, max_trials=0)
    assert caught.value.status == 422
    assert "resources.nodes.0.gpu: unknown key in an AutoDist node" in str(caught.value)
    assert isinstance(caught.value.detail, list) and caught.value.detail[0]["loc"][:2] == ["body", "resources"]


def test_a_trial_with_an_unknown_field_or_a_foreign_strategy_is_rejected_with_its_path(
    client: stratagem.Client,
) -> None:
    graph, small, large = make_mlp_graph(), make_cpu_cluster(2), make_t4_cluster(2)
    client.upload_graph(graph)
    client.upload_resources(small)
    on_large = client.optimize(graph, large, max_trials=0, search=QUICK_SEARCH).wait(60).best()
    with pytest.raises(RequestRejectedError, match=r"body\.colour: Extra inputs are not permitted"):
        client.record_trial(on_large, graph_id=graph.id, resource_id=small.id, step_times_s=[0.1], colour="red")
    with pytest.raises(RequestRejectedError, match=r"body\.strategy") as caught:
        client.record_trial(on_large, graph_id=graph.id, resource_id=small.id, step_times_s=[0.1])
    assert caught.value.status == 422


def test_an_unreachable_service_raises_service_unavailable() -> None:
    with (
        stratagem.Client(closed_port_url(), timeout=2) as client,
        pytest.raises(ServiceUnavailableError, match="cannot reach"),
    ):
        client.health()


def test_best_of_a_queued_job_is_a_conflict_and_waiting_past_the_timeout_is_unavailable(queue_only: str) -> None:
    with stratagem.Client(queue_only) as client:
        job = client.optimize(make_mlp_graph(), make_t4_cluster(2), max_trials=0)
        with pytest.raises(RequestRejectedError) as caught:
            job.best()
        assert caught.value.status == 409
        with pytest.raises(ServiceUnavailableError, match=f"job {job.id} still queued"):
            job.wait(timeout=0.3, poll_s=0.05)


def test_a_cancelled_job_makes_wait_raise_with_its_status(queue_only: str) -> None:
    with stratagem.Client(queue_only) as client:
        job = client.optimize(make_mlp_graph(), make_t4_cluster(2), max_trials=0).cancel()
        assert job.status == "cancelled"
        with pytest.raises(ServiceError, match="cancelled"):
            job.wait(timeout=5)


def test_writes_need_the_api_key_when_the_service_has_one(tmp_path: Path) -> None:
    with served(f"sqlite:///{tmp_path / 'keyed.db'}", api_key="s3cret") as address:
        with stratagem.Client(address) as anonymous, pytest.raises(RequestRejectedError) as caught:
            anonymous.upload_graph(make_mlp_graph())
        assert caught.value.status == 401
        with stratagem.Client(address, api_key="s3cret") as keyed:
            assert keyed.upload_graph(make_mlp_graph()) == make_mlp_graph().id


def test_wait_draws_a_progress_bar_that_ends_on_the_final_state(client: stratagem.Client) -> None:
    stream = io.StringIO()
    client.optimize(make_mlp_graph(batch_size=4), make_t4_cluster(2), max_trials=0, search=QUICK_SEARCH).wait(
        60, poll_s=0.05, progress=stream
    )
    frames = stream.getvalue().split("\r")
    assert frames[-1].endswith("\n") and "succeeded" in frames[-1] and "done" in frames[-1]
    assert "candidates, trials 0/0" in frames[-1]


def test_render_progress_fills_the_bar_by_trials_done() -> None:
    job = {
        "status": "running",
        "phase": "trials",
        "progress": {"trials_budget": 4, "trials_done": 2, "candidates_evaluated": 1234, "best_step_time_s": 0.0125},
    }
    assert render_progress(job, width=8) == "[####    ] running   trials     1234 candidates, trials 2/4 best 12.5 ms"
    assert render_progress({"status": "succeeded", "progress": {}}, width=4).startswith("[####] succeeded")
    stopped_early = {"status": "succeeded", "phase": "done", "progress": {"trials_budget": 4, "trials_done": 2}}
    assert render_progress(stopped_early, width=4).startswith("[####] succeeded")
    searching = {
        "status": "running",
        "phase": "searching",
        "progress": {"trials_budget": 4, "candidates_evaluated": 900},
    }
    assert render_progress(searching, width=4) == "[    ] running   searching  900 candidates, trials 0/4"


def test_the_one_liner_captures_a_module_and_returns_the_best_strategy(url: str) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    cluster = make_cpu_cluster(2)
    best = stratagem.optimize(
        model,
        cluster,
        example_inputs=(torch.randn(8, 32),),
        batch_size=8,
        url=url,
        max_trials=0,
        search=QUICK_SEARCH,
        progress=False,
        timeout=60,
    )
    assert isinstance(best, stratagem.Strategy)
    assert best.replicas == cluster.compute_devices
    assert {v.var_name for v in best.variables} == {"0.weight", "0.bias", "2.weight", "2.bias"}


def test_the_one_liner_refuses_a_module_without_example_inputs() -> None:
    with pytest.raises(StratagemError, match="needs example_inputs and batch_size"):
        stratagem.optimize(torch.nn.Linear(2, 2), make_cpu_cluster(2), url=closed_port_url())
