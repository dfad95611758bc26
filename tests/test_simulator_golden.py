"""Predictions of the golden set are unchanged (1e-12 relative) unless a formula changed on purpose.

The fixture was written by `tests/simulator_golden.py`; when a formula changes on purpose, rewrite it
there and say in the commit which candidates moved and why. An input that no longer matches its
fingerprint (a builder, the search's proposals or capture changed) is reported as such, apart from a
changed prediction.
"""

from __future__ import annotations

import json

import pytest
from simulator_golden import FIXTURE, TOLERANCE, cases, predict

from simulator import BREAKDOWN_KEYS


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(FIXTURE.read_text())


def _close(a: float, b: float, scale: float = 0.0) -> bool:
    """Within TOLERANCE of the larger value, or for a breakdown component of the step time (summation
    order, which numpy may vary with memory alignment, leaves components that cancel at ~1e-16 of the step)."""
    return a == b or abs(a - b) <= TOLERANCE * max(abs(a), abs(b), scale)


def test_every_golden_prediction_is_unchanged(golden):
    recorded = {(c["graph"], c["cluster"]): c for c in golden["cases"]}
    keys = golden["breakdown_keys"]
    changed_inputs, changed = [], []
    seen = 0
    for case in cases():
        record = recorded[(case.graph, case.cluster)]
        where = f"{case.graph} on {case.cluster}"
        if (record["graph_id"], record["resources_id"]) != (case.graph_id, case.resources_id):
            changed_inputs.append(f"{where}: graph or cluster")
            continue
        old = {c["input"]: c for c in record["candidates"]}
        for now in predict(case):
            before = old.get(now["input"])
            if before is None:
                changed_inputs.append(f"{where}: {now['source']}")
                continue
            seen += 1
            breakdown = dict(zip(BREAKDOWN_KEYS, now["breakdown"], strict=True))
            expected = dict.fromkeys(BREAKDOWN_KEYS, 0.0) | dict(zip(keys, before["breakdown"], strict=True))
            pairs = [("step_time", now["step_time"], before["step_time"]), ("memory", now["memory"], before["memory"])]
            pairs += [(key, breakdown[key], expected[key]) for key in BREAKDOWN_KEYS]
            step = max(now["step_time"], before["step_time"])
            moved = [
                f"{name} {b!r} -> {a!r}" for name, a, b in pairs if not _close(a, b, step if name in keys else 0.0)
            ]
            if now["feasible"] != before["feasible"]:
                moved.append(f"feasible {before['feasible']} -> {now['feasible']}")
            if moved:
                changed.append(f"{where}, {now['source']}: " + "; ".join(moved))
    assert not changed, f"{len(changed)} predictions moved:\n" + "\n".join(changed[:20])
    assert not changed_inputs, (
        f"{len(changed_inputs)} inputs no longer match the fixture (rewrite it with tests/simulator_golden.py "
        "once the simulator is known unchanged):\n" + "\n".join(changed_inputs[:20])
    )
    assert seen == sum(len(c["candidates"]) for c in golden["cases"])
