// Stratagem dashboard: draws the server's plotly figures and follows a running job live.
"use strict";

(function () {
  const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
  const POLL_MS = 1000;

  function drawCharts() {
    if (typeof Plotly === "undefined") return;
    for (const element of document.querySelectorAll("[data-figure]")) {
      const source = document.getElementById(element.dataset.figure);
      if (!source) continue;
      const figure = JSON.parse(source.textContent);
      Plotly.newPlot(element, figure.data, figure.layout, { displaylogo: false, responsive: true });
    }
  }

  function count(value) {
    return Number(value || 0).toLocaleString("en-US");
  }

  function seconds(value) {
    if (value === null || value === undefined || !isFinite(value)) return "—";
    if (value < 1e-3) return `${(value * 1e6).toPrecision(3)} µs`;
    if (value < 1) return `${(value * 1e3).toPrecision(3)} ms`;
    return `${value.toPrecision(3)} s`;
  }

  // The same rules as optimizer_service/dashboard/progress.py, applied to GET /v1/jobs/{id}.
  function progressOf(job, now) {
    const progress = job.progress || {};
    const evaluated = progress.candidates_evaluated || 0;
    if (TERMINAL.has(job.status)) {
      if (job.status === "succeeded") {
        return { fraction: 1, text: `done: ${count(evaluated)} candidates evaluated, ${progress.trials_done || 0} trial(s)` };
      }
      return { fraction: 1, text: `${job.status}: ${job.error || "no reason recorded"}` };
    }
    if (job.status === "queued") return { fraction: 0, text: "queued: waiting for a worker" };
    if (job.phase === "trials") {
      const done = progress.trials_done || 0;
      const budget = progress.trials_budget || 0;
      return { fraction: budget ? done / budget : 0, text: `trials: ${done} of ${budget} run` };
    }
    if (job.phase === "finalizing") return { fraction: 1, text: "finalizing: ranking and storing the answer" };
    const search = (job.options || {}).search || {};
    const maxCandidates = search.max_candidates || 0;
    const budget = search.time_budget_s || 0;
    const elapsed = job.started_at ? Math.max(0, (now - Date.parse(job.started_at)) / 1000) : 0;
    const fraction = Math.min(1, Math.max(maxCandidates ? evaluated / maxCandidates : 0, budget ? elapsed / budget : 0));
    const text = `searching: ${count(evaluated)} of at most ${count(maxCandidates)} candidates, ` +
      `${Math.min(elapsed, budget).toFixed(0)} of ${budget} s`;
    return { fraction, text };
  }

  function show(section, job) {
    const progress = progressOf(job, Date.now());
    const bar = section.querySelector("[data-live-bar]");
    bar.value = progress.fraction;
    bar.className = `bar-${job.status}`;
    section.querySelector("[data-live-text]").textContent = progress.text;
    section.querySelector("[data-live-phase]").textContent = job.phase;
    section.querySelector("[data-live-evaluated]").textContent = count((job.progress || {}).candidates_evaluated);
    section.querySelector("[data-live-best]").textContent = seconds((job.progress || {}).best_step_time_s);
    const badge = section.querySelector("[data-status-badge]");
    badge.textContent = job.status;
    badge.className = `badge badge-${job.status}`;
    section.querySelector("[data-live-error]").textContent = "";
    section.dataset.polls = String(Number(section.dataset.polls) + 1);
  }

  function follow(section) {
    let busy = false;
    const timer = window.setInterval(async function () {
      if (busy) return;
      busy = true;
      try {
        const response = await fetch(section.dataset.jobUrl, { headers: { Accept: "application/json" }, cache: "no-store" });
        if (!response.ok) throw new Error(`the service answered ${response.status}`);
        const job = await response.json();
        show(section, job);
        if (TERMINAL.has(job.status)) {
          window.clearInterval(timer);
          window.location.reload();  // the candidates and charts exist only now
        }
      } catch (error) {
        section.querySelector("[data-live-error]").textContent = `could not refresh: ${error.message}`;
      } finally {
        busy = false;
      }
    }, POLL_MS);
  }

  drawCharts();
  const live = document.getElementById("live");
  if (live && live.dataset.live === "true") follow(live);
})();
