"""Reproducible measurements that print JSON.

Run each from the repository root as a module, `python -m benchmarks.simulator_accuracy --help`. The
scripts are thin command lines; what more than one of them needs (records files, the cases they
measure, scoring, the interleaved measurement) is the importable library `benchmarks.lib`.
"""
