"""Business rules of the service, independent of HTTP: handlers translate requests into these calls."""
