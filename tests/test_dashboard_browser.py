"""The dashboard in a real headless Chromium against the real app served by uvicorn on 127.0.0.1.

One server for the module, on SQLite in a temporary folder, seeded through the API: two finished
optimize jobs (one graph named `<script>alert(1)</script>`), trials recorded with `POST /v1/trials`
and a cost model trained on them. The live-progress test adds a job with a long search, watches it
run, then cancels it (its search shares the server's CPU, so it runs only while it is watched).
Every page must load with no console error, no page error, no dialog and no request leaving the
machine; screenshots go to `artifacts/dashboard/`.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
import uvicorn
from dashboard_helpers import XSS_NAME, hostile_graph, record_failed_trial, record_trials, submit, wait_until
from sample_documents import make_embedding_graph, make_t4_cluster
from service_helpers import service_settings

from optimizer_service.app import create_app
from simulator.learned import Trainer
from stratagem.runtime.launch import free_port

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "dashboard"
DONE = {"succeeded", "failed", "cancelled"}

playwright_api = pytest.importorskip("playwright.sync_api")
if shutil.which(CHROMIUM) is None:
    pytest.skip(f"Chromium is not installed at {CHROMIUM} (apt-get install -y chromium)", allow_module_level=True)


@dataclass
class Site:
    url: str
    client: httpx.Client
    jobs: list[dict[str, Any]]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    database = tmp_path_factory.mktemp("dashboard") / "dashboard.db"
    app = create_app(
        service_settings(f"sqlite:///{database}", workers=1), cost_model_trainer=Trainer(n_bootstrap=2, n_estimators=20)
    )
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, name="dashboard-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    url = f"http://127.0.0.1:{server.config.port}"
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            yield Site(url=url, client=client, jobs=_seed(client))
    finally:
        server.should_exit = True
        thread.join(timeout=60)


def _seed(client: httpx.Client) -> list[dict[str, Any]]:
    jobs = []
    for index, (graph, cluster) in enumerate(
        [(hostile_graph(), make_t4_cluster(2)), (make_embedding_graph(), make_t4_cluster(2))]
    ):
        job = wait_until(client, submit(client, graph, cluster)["id"], DONE)
        assert job["status"] == "succeeded", job
        record_trials(client, job, count=6, seed=index, bias=1.2 + 0.3 * index)
        jobs.append(job)
    record_failed_trial(client, jobs[0])
    assert client.post("/v1/cost-model/retrain").status_code == 201
    return jobs


@dataclass
class Watched:
    """What a page did that it must not: console errors, uncaught errors, dialogs, requests off the machine."""

    console: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)

    def assert_clean(self) -> None:
        assert (self.console, self.errors, self.dialogs, self.outside) == ([], [], [], [])


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[tuple[Any, Watched]]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    watched = Watched()
    tab = context.new_page()
    tab.on("console", lambda message: watched.console.append(message.text) if message.type == "error" else None)
    tab.on("pageerror", lambda error: watched.errors.append(str(error)))

    def on_dialog(dialog: Any) -> None:
        watched.dialogs.append(dialog.message)
        dialog.dismiss()

    def on_route(route: Any) -> None:
        if urlparse(route.request.url).hostname != "127.0.0.1":
            watched.outside.append(route.request.url)
            route.abort()
        else:
            route.continue_()

    tab.on("dialog", on_dialog)
    context.route("**/*", on_route)
    yield tab, watched
    context.close()


def _visit(tab: Any, url: str, charts: list[str], shot: str) -> None:
    response = tab.goto(url, wait_until="load")
    assert response is not None and response.status == 200, url
    for name in charts:
        tab.wait_for_selector(f"#chart-{name} .main-svg", timeout=15_000)
    tab.wait_for_timeout(300)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / f"{shot}.png"), full_page=True)


def test_the_jobs_list_loads_cleanly_and_escapes_names(site: Site, page: tuple[Any, Watched]) -> None:
    tab, watched = page
    _visit(tab, f"{site.url}/", [], "jobs")
    assert tab.locator("table.jobs tbody tr").count() == len(site.jobs)
    assert tab.get_by_text(XSS_NAME, exact=True).count() == 1, "the script tag shows as text"
    assert tab.locator("table.jobs .badge-succeeded").count() == len(site.jobs)
    watched.assert_clean()


def test_a_finished_job_page_draws_its_charts(site: Site, page: tuple[Any, Watched]) -> None:
    tab, watched = page
    job = site.jobs[0]
    _visit(tab, f"{site.url}/jobs/{job['id']}", ["versus", "breakdown", "space"], "job")
    assert tab.locator("h1").inner_text().startswith(XSS_NAME)
    assert tab.locator("#chart-breakdown .main-svg .bars path").count() > 0
    assert tab.locator("#live").get_attribute("data-live") == "false"
    watched.assert_clean()


def test_the_strategy_page_shows_where_each_variable_goes(site: Site, page: tuple[Any, Watched]) -> None:
    tab, watched = page
    job = site.jobs[1]
    _visit(
        tab,
        f"{site.url}/strategies/{job['best_strategy_id']}?job={job['id']}",
        ["destinations", "breakdown"],
        "strategy",
    )
    layers = tab.locator("table.placement tr.layer").all_inner_texts()
    assert [text.split()[0] for text in layers] == ["embedding", "fc1", "fc2"]
    hostile = site.jobs[0]
    _visit(
        tab,
        f"{site.url}/strategies/{hostile['best_strategy_id']}?job={hostile['id']}",
        ["destinations"],
        "strategy-hostile-names",
    )
    assert tab.locator("table.placement img").count() == 0
    watched.assert_clean()


def test_the_trials_page_draws_time_accuracy_and_knobs(site: Site, page: tuple[Any, Watched]) -> None:
    tab, watched = page
    _visit(tab, f"{site.url}/trials", ["over_time", "versus", "knobs"], "trials")
    assert "MAPE" in (tab.locator("#chart-versus .gtitle").text_content() or "")
    assert tab.locator("table.trials tbody tr").count() == 13
    tab.select_option("select[name=outcome]", "oom")
    tab.click("form.filters button")
    tab.wait_for_load_state("load")
    assert tab.locator("table.trials tbody tr").count() == 1
    tab.click("table.trials thead a:has-text('Measured')")
    tab.wait_for_load_state("load")
    assert "sort=measured" in tab.url and "outcome=oom" in tab.url
    watched.assert_clean()


def test_the_cost_model_page_draws_scores_and_importances(site: Site, page: tuple[Any, Watched]) -> None:
    tab, watched = page
    _visit(tab, f"{site.url}/cost-model", ["metrics", "importance"], "cost-model")
    assert tab.locator("table.data tbody tr").first.get_by_text("in use").count() == 1
    watched.assert_clean()


def test_an_unknown_job_is_a_404_page(site: Site, page: tuple[Any, Watched]) -> None:
    tab, watched = page
    response = tab.goto(f"{site.url}/jobs/00000000-0000-4000-8000-000000000000")
    assert response is not None and response.status == 404
    assert "No such job" in tab.locator("h1").inner_text()
    tab.screenshot(path=str(ARTIFACTS / "not-found.png"))
    # The browser reports the 404 itself as a failed resource load; that is the point of this page.
    assert [m for m in watched.console if "404" not in m] == []
    watched.console.clear()
    watched.assert_clean()


def test_a_running_job_updates_its_progress_live_and_shows_the_end(site: Site, page: tuple[Any, Watched]) -> None:
    tab, watched = page
    long = submit(
        site.client,
        make_embedding_graph(batch_size=128),
        make_t4_cluster(4),
        time_budget_s=120,
        max_candidates=5_000_000,
    )
    try:
        assert wait_until(site.client, long["id"], {"running", *DONE})["status"] == "running"
        _visit(tab, f"{site.url}/", [], "jobs-with-a-running-job")
        assert tab.locator("table.jobs .badge-running").count() == 1
        _visit(tab, f"{site.url}/jobs/{long['id']}", ["space"], "job-running")
        assert tab.locator("#live").get_attribute("data-live") == "true"
        tab.evaluate("window.__sameDocument = true")
        first_bar = float(tab.locator("[data-live-bar]").evaluate("bar => bar.value"))
        first_count = tab.locator("[data-live-evaluated]").inner_text()
        tab.wait_for_function("document.getElementById('live').dataset.polls >= 3", timeout=15_000)
        tab.wait_for_function(
            f"document.querySelector('[data-live-evaluated]').textContent !== {first_count!r}", timeout=15_000
        )
        assert float(tab.locator("[data-live-bar]").evaluate("bar => bar.value")) > first_bar
        assert tab.locator("[data-live-text]").inner_text().startswith("searching:")
        assert tab.evaluate("window.__sameDocument") is True, "the page must not reload while the job runs"
        tab.screenshot(path=str(ARTIFACTS / "job-running-later.png"), full_page=True)
    finally:
        site.client.post(f"/v1/jobs/{long['id']}/cancel")
    # Once the job ends the page reloads by itself, to show the final state.
    tab.wait_for_function(
        "window.__sameDocument === undefined && document.getElementById('live').dataset.live === 'false'",
        timeout=30_000,
    )
    assert tab.locator("#live [data-status-badge]").inner_text() == "cancelled"
    tab.wait_for_selector("#chart-space .main-svg", timeout=15_000)
    tab.screenshot(path=str(ARTIFACTS / "job-cancelled.png"), full_page=True)
    watched.assert_clean()
