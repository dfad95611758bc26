"""benchmarks/embedding_lookups.py: embedding tables priced by their lookups, not by their size."""

from __future__ import annotations

from sample_documents import make_t4_cluster

from benchmarks import embedding_lookups as lookups


def test_a_sparse_tables_measured_and_priced_step_do_not_grow_with_its_rows() -> None:
    spec = make_t4_cluster(1)
    small, large = (lookups.one_table(rows, 16, 256, sparse=True) for rows in (1_000, 1_000_000))
    assert lookups.priced_seconds(*small, spec) == lookups.priced_seconds(*large, spec)
    forward, backward = lookups.timed_steps(*large, repeats=3)
    assert forward > 0 and backward > 0
