"""One router per resource, each owning its prefix and tags."""

from optimizer_service.api.routes import cost_model, graphs, health, jobs, predict, resources, strategies, trials

__all__ = ["cost_model", "graphs", "health", "jobs", "predict", "resources", "strategies", "trials"]
