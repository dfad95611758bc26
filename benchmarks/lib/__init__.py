"""What the benchmarks share, importable by scripts and tests alike.

- `records`: trial records files ({graph, resources, strategy, result} per line, plain or compressed)
  read back under today's schema, and the per-strategy pairs the accuracy benchmark scores;
- `cases`: the zoo models and replayed jobs the CPU benchmarks measure, and the strategies each gets;
- `scoring`: the accuracy benchmark's scores (MAPE and Kendall tau from `simulator.metrics`, noise,
  resolved pairs, ablations, pools of several runs);
- `learned`: the cost-model benchmark's analysis (rounds folded per strategy, noise floor, learning
  curve, low-shot replay);
- `interleaved`: every strategy of one job measured side by side by one pair of gloo ranks;
- `gpu`: the one-GPU cases and their plain-PyTorch reference step;
- `system`: process-level helpers (page faults, niceness).
- `published_*`: `benchmarks/published.py`'s rows (model, cluster and layout of each published GPU run),
  its graph cache, scores, learned correction and trial export.
"""
