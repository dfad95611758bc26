"""The trial-history dashboard: server-rendered pages over the service's database, charts by plotly.js.

    app.include_router(dashboard.router)

Pages: `/` (jobs), `/jobs/{id}`, `/strategies/{id}`, `/trials`, `/cost-model`; see docs/dashboard.md.
"""

from optimizer_service.dashboard.router import router

__all__ = ["router"]
