"""Example workloads: the model zoo (`examples.zoo`) and, from other parts of the project, scripts."""
