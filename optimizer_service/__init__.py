"""The Stratagem service: REST API, jobs, persistence and the search that answers them.

Build an app with `optimizer_service.app.create_app(settings)`; run one with
`python -m optimizer_service` (uvicorn, settings from the environment).
"""
