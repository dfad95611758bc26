"""Jobs: the optimization pipeline, the database-backed queue, and the worker threads that run it."""
