"""The engine: a consumer process, the producer loop and what it is made of: in-flight
state, fetchers (Redis, the database fallback), executors (local threads; Celery's lives
in contrib and is named by dotted path), time-outs, the recorder, the pre-loader pass.
Imports the public API and every layer below it; never ``delayjobs.contrib``.
"""
