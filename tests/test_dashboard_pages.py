"""The dashboard's pages over the real app and database (SQLite and PostgreSQL), without a browser.

The browser tests (`test_dashboard_browser.py`) prove the pages draw and update; these prove what the
server sends: the right rows, escaped names, empty states, 404s and 422s, and plotly.js from the
installed package.
"""

from __future__ import annotations

import html
import re
import statistics
from pathlib import Path

from dashboard_helpers import (
    XSS_LAYER,
    XSS_NAME,
    candidates,
    hostile_graph,
    record_failed_trial,
    record_trials,
    submit,
    wait_until,
)
from fastapi.testclient import TestClient
from sample_documents import make_embedding_graph, make_mlp_graph, make_t4_cluster

from models import StrategyRow, utcnow
from optimizer_service.dashboard import formatting
from optimizer_service.dashboard.router import plotly_js_path
from optimizer_service.db import make_engine, make_session_factory
from simulator.learned import Trainer

DONE = {"succeeded", "failed", "cancelled"}


def _html(client: TestClient, path: str, status: int = 200) -> str:
    response = client.get(path)
    assert response.status_code == status, (path, response.status_code, response.text[:500])
    assert response.headers["content-type"].startswith("text/html")
    return response.text


def _succeeded(client: TestClient, graph=None, resources=None) -> dict:
    job = submit(client, graph or make_mlp_graph(), resources or make_t4_cluster(2))
    job = wait_until(client, job["id"], DONE)
    assert job["status"] == "succeeded", job
    return job


def test_every_page_has_an_empty_state_that_says_what_to_do(make_client) -> None:
    client: TestClient = make_client(workers=0)
    jobs = _html(client, "/")
    assert "No jobs yet" in jobs and "stratagem optimize" in jobs and "POST /v1/optimize" in jobs
    trials = _html(client, "/trials")
    assert "No trials yet" in trials and "POST /v1/trials" in trials
    cost_model = _html(client, "/cost-model")
    assert "No cost-model version yet" in cost_model and "/v1/cost-model/retrain" in cost_model
    assert "plotly.min.js" not in jobs, "a page without charts should not load plotly.js"


def test_user_supplied_names_are_escaped_on_every_page(make_client) -> None:
    client: TestClient = make_client()
    job = _succeeded(client, hostile_graph())
    record_trials(client, job, count=2, seed=1)
    best = job["best_strategy_id"]
    for path in [
        "/",
        f"/jobs/{job['id']}",
        f"/strategies/{best}?job={job['id']}",
        "/trials",
        f"/trials?job={job['id']}",
    ]:
        page = _html(client, path)
        assert XSS_NAME not in page and "<img src=x" not in page, path
        assert html.escape(XSS_NAME, quote=False) in page or path.startswith("/strategies"), path
    placement = _html(client, f"/strategies/{best}?job={job['id']}")
    assert (
        html.escape(XSS_LAYER, quote=False) in placement
        and html.escape(XSS_LAYER + ".weight", quote=False) in placement
    )


def test_the_jobs_list_shows_each_job_with_its_best_predicted_and_measured_step(make_client) -> None:
    client: TestClient = make_client()
    job = _succeeded(client, make_mlp_graph(name="mlp-list"), make_t4_cluster(2))
    trials = record_trials(client, job, count=3, seed=2)
    page = _html(client, "/")
    row = re.search(rf'<tr data-job-id="{job["id"]}">(.*?)</tr>', page, re.S)
    assert row is not None
    text = row.group(1)
    assert "mlp-list" in text and "t4-2x4" in text and "(8 devices)" in text and "succeeded" in text
    best = next(c for c in candidates(client, job["id"]) if c["strategy_id"] == job["best_strategy_id"])
    assert formatting.seconds(best["predicted"]["step_time_s"]) in text
    assert formatting.seconds(min(t["median_s"] for t in trials)) in text
    assert f"/trials?job={job['id']}" in text and f"/strategies/{job['best_strategy_id']}?job={job['id']}" in text


def test_the_job_page_ranks_candidates_and_shows_the_space_and_breakdown(make_client) -> None:
    client: TestClient = make_client()
    job = _succeeded(client, make_embedding_graph(), make_t4_cluster(2))
    trials = record_trials(client, job, count=2, seed=3)
    page = _html(client, f"/jobs/{job['id']}")
    ranked = candidates(client, job["id"])
    positions = [page.index(f"/strategies/{c['strategy_id']}?job={job['id']}") for c in ranked]
    assert positions == sorted(positions), "candidates are listed in rank order"
    for trial in trials:
        assert formatting.seconds(trial["median_s"]) in page
    space = job["result"]["search"]["space"]
    assert f"10<sup>{space['log10_candidates']:.1f}</sup>" in page
    for figure in ("figure-breakdown", "figure-versus", "figure-space"):
        assert f'id="{figure}"' in page
    assert '"name": "compute"' in page or '"name":"compute"' in page
    assert 'data-live="false"' in page


def test_a_queued_job_counts_its_space_before_the_search_reports(make_client) -> None:
    client: TestClient = make_client(workers=0)
    job = submit(client, make_mlp_graph(), make_t4_cluster(2))
    page = _html(client, f"/jobs/{job['id']}")
    assert 'data-live="true"' in page and "queued: waiting for a worker" in page
    assert "counted from the job&#39;s graph and cluster" in page and 'id="figure-space"' in page


def test_the_strategy_page_lists_each_variable_under_its_layer(make_client) -> None:
    client: TestClient = make_client()
    graph = make_embedding_graph()
    job = _succeeded(client, graph, make_t4_cluster(2))
    ps = next(c for c in candidates(client, job["id"]) if c["source"] == "PartitionedPS")
    page = _html(client, f"/strategies/{ps['strategy_id']}?job={job['id']}")
    for layer in ("embedding", "fc1", "fc2"):
        assert f'<tr class="layer"><th colspan="8">{layer} ' in page
    assert "axis 0 × 2" in page and "10.0.0.2:CPU:0" in page and "frozen (not trainable)" in page
    assert formatting.nbytes(graph.variable("embedding.weight").nbytes / 2) in page
    assert formatting.seconds(ps["predicted"]["step_time_s"]) in page
    assert 'id="figure-destinations"' in page and 'id="figure-breakdown"' in page
    assert "does not rank this strategy" not in page
    stranger = "00000000-0000-4000-8000-000000000000"
    alone = _html(client, f"/strategies/{ps['strategy_id']}?job={stranger}")
    assert f"job {stranger} does not rank this strategy, so it is shown on its own" in alone
    assert f"/jobs/{stranger}" not in alone and "10.0.0.2:CPU:0" in alone


def test_trials_filter_by_job_and_outcome_and_sort_by_any_column(make_client) -> None:
    client: TestClient = make_client()
    first = _succeeded(client, make_mlp_graph(name="first"), make_t4_cluster(2))
    second = _succeeded(client, make_embedding_graph(), make_t4_cluster(1))
    ok_first = record_trials(client, first, count=3, seed=4)
    record_trials(client, second, count=2, seed=5)
    failed = record_failed_trial(client, first)
    mine = _html(client, f"/trials?job={first['id']}")
    assert "4 trial(s)" in mine and "CUDA out of memory" in mine
    measured = _html(client, f"/trials?job={first['id']}&outcome=ok&sort=measured&order=asc")
    shown = [t["median_s"] for t in sorted(ok_first, key=lambda t: t["median_s"])]
    positions = [measured.index(formatting.seconds(m)) for m in shown]
    assert positions == sorted(positions) and "3 trial(s)" in measured and failed["id"][:8] not in measured
    errors = [abs(t["predicted_step_time_s"] - t["median_s"]) / t["median_s"] for t in ok_first]
    mape = statistics.fmean(errors)
    assert f"MAPE {mape * 100:.1f}%" in measured
    everything = _html(client, "/trials?sort=error&order=desc")
    assert "6 trial(s)" in everything and 'id="figure-knobs"' in everything and 'id="figure-over_time"' in everything
    assert _html(client, "/trials?outcome=hang").count("No trials match this filter") == 1


def test_bad_filters_name_the_parameter_and_the_reason(make_client) -> None:
    client: TestClient = make_client(workers=0)
    page = _html(client, "/trials?job=nope&outcome=melted&sort=colour&order=up&graph=abc", status=422)
    for expected in (
        "query.job: &#39;nope&#39; is not a job id",
        "query.outcome: &#39;melted&#39; is not one of",
        "query.sort: &#39;colour&#39;",
        "query.order: &#39;up&#39;",
        "query.graph: &#39;abc&#39;",
    ):
        assert expected in page
    assert "query.version" in _html(client, "/cost-model?version=latest", status=422)
    assert "query.job" in _html(client, f"/strategies/{'0' * 64}?job=x", status=422)


def test_unknown_or_malformed_ids_answer_an_html_404(make_client) -> None:
    client: TestClient = make_client(workers=0)
    for path in [
        "/jobs/00000000-0000-4000-8000-000000000000",
        "/jobs/not-a-uuid",
        f"/strategies/{'a' * 64}",
        "/strategies/short",
        "/cost-model?version=7",
        "/static/evil.js",
    ]:
        page = _html(client, path, status=404)
        assert "No such" in page and "Back to the jobs" in page, path


def test_plotly_is_served_from_the_installed_package_not_the_repository(make_client) -> None:
    client: TestClient = make_client(workers=0)
    response = client.get("/static/plotly.min.js")
    path = plotly_js_path()
    assert response.status_code == 200 and path is not None
    assert response.content == path.read_bytes() and "site-packages" in str(path)
    assert response.headers["content-type"].startswith("text/javascript")
    repo = Path(__file__).resolve().parents[1]
    assert not [p for p in repo.rglob("plotly*.js") if ".venv" not in p.parts and "artifacts" not in p.parts]
    assert (
        client.get("/static/dashboard.js").status_code == 200 and client.get("/static/dashboard.css").status_code == 200
    )


def test_pages_are_not_in_the_api_schema_and_carry_a_script_policy(make_client) -> None:
    client: TestClient = make_client(workers=0)
    paths = client.get("/openapi.json").json()["paths"]
    assert not {"/", "/trials", "/cost-model", "/jobs/{job_id}", "/static/{name}"} & set(paths)
    policy = client.get("/").headers["content-security-policy"]
    assert "script-src 'self'" in policy and "'unsafe-inline'" not in policy.split("script-src")[1].split(";")[0]


def test_pages_need_the_read_key_when_reads_do(make_client) -> None:
    client: TestClient = make_client(workers=0, api_key="s3cret", read_requires_key=True)
    assert client.get("/").status_code == 401
    assert client.get("/", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/static/dashboard.css").status_code == 200


def test_the_cost_model_page_shows_scores_and_feature_importance(make_client) -> None:
    client: TestClient = make_client(cost_model_trainer=Trainer(n_bootstrap=2, n_estimators=20))
    for seed, graph in enumerate((make_mlp_graph(), make_embedding_graph())):
        record_trials(client, _succeeded(client, graph, make_t4_cluster(2)), count=8, seed=seed, bias=1.2 + seed)
    version = client.post("/v1/cost-model/retrain").json()
    page = _html(client, "/cost-model")
    assert version["version"] in page and "in use" in page
    assert "of the correction its boosters fitted" in page
    corrected = version["metrics"]["corrected"]
    assert (
        formatting.percent(corrected["mape"]) in page
        and formatting.percent(version["metrics"]["simulator"]["mape"]) in page
    )
    assert "figure-metrics" in page, page[page.find("<main>") :]
    assert "figure-importance" in page, page[page.find("Feature importance") :][:400]
    assert _html(client, f"/cost-model?version={version['id']}") == page


def test_the_cost_model_page_shows_each_places_level(make_client) -> None:
    """Trials recorded by two backends (this service's runner, an imported paper) keep their own levels."""
    client: TestClient = make_client(cost_model_trainer=Trainer(n_bootstrap=2, n_estimators=20))
    for seed, (graph, backend, bias) in enumerate(
        [(make_mlp_graph(), "ray", 2.0), (make_embedding_graph(), "paper-2021", 1.0)]
    ):
        record_trials(
            client, _succeeded(client, graph, make_t4_cluster(2)), count=8, seed=seed, bias=bias, backend=backend
        )
    client.post("/v1/cost-model/retrain").raise_for_status()
    page = _html(client, "/cost-model")
    table = page[page.find('id="place-levels"') :][:800]
    assert "measured in 2 places" in page and "ray" in table and "paper-2021" in table, table
    ray = float(table.split('ray</td><td class="num">')[1].split("&times;")[0])
    assert 1.4 < ray < 2.0


def test_a_cost_model_in_another_format_says_why_it_shows_no_importances(make_client) -> None:
    class Constant:
        def train(self, samples):
            from optimizer_service.core.cost_model import TrainedCostModel

            return TrainedCostModel(
                model_json='{"kind": "constant"}', n_train=len(samples), version="constant-1", metrics={"mape": 0.25}
            )

    client: TestClient = make_client(cost_model_trainer=Constant())
    record_trials(client, _succeeded(client), count=1, seed=9)
    assert client.post("/v1/cost-model/retrain").status_code == 201
    page = _html(client, "/cost-model")
    assert "the stored model could not be read" in page and "25.0%" in page and 'id="figure-importance"' not in page


def test_a_version_kept_out_of_use_says_why_on_the_cost_model_page(make_client) -> None:
    worse = {
        "simulator": {"top1_regret": 0.04, "log_error": 0.2},
        "corrected": {"top1_regret": 0.09, "log_error": 0.25},
    }

    class Worse:
        def train(self, samples):
            from optimizer_service.core.cost_model import TrainedCostModel

            return TrainedCostModel(
                model_json='{"kind": "constant"}', n_train=len(samples), version="worse-1", metrics=worse
            )

    client: TestClient = make_client(cost_model_trainer=Worse())
    record_trials(client, _succeeded(client), count=2, seed=3)
    assert client.post("/v1/cost-model/retrain").json()["in_use"] is False
    page = _html(client, "/cost-model")
    assert "kept out" in page and "Kept out of use" in page and "top1_regret 0.09 &gt; simulator&#39;s 0.04" in page


def test_a_stored_strategy_that_no_longer_parses_is_reported_not_crashed(make_client, database_url: str) -> None:
    client: TestClient = make_client(workers=0)
    engine = make_engine(database_url)
    with make_session_factory(engine)() as session:
        session.add(
            StrategyRow(id="b" * 64, json={"schema_version": "1", "replicas": [], "variables": []}, created_at=utcnow())
        )
        session.commit()
    engine.dispose()
    page = _html(client, f"/strategies/{'b' * 64}", status=500)
    assert "A stored document could not be read" in page and "replicas" in page
