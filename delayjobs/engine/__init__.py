"""The engine (layer 5): a consumer process, the producer loop and what it is made of:
in-flight state, fetchers (Redis, the database fallback), executors (local threads;
Celery's lives in contrib and is named by dotted path), time-outs, the recorder, the
pre-loader pass. Imports layers 0-4 (foundation, spec, transitions, index, api); never
``delayjobs.contrib``.
"""
