"""HTTP: routers, dependencies, schemas, middleware and the one exception-to-status mapping."""
