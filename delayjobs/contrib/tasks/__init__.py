"""The Django Tasks backend (``DelayJobsBackend``) and the ``django.task`` job type.

Order inside: compat <- options <- discovery <- results <- job_type <- backend. Never
imports ``contrib.celery``. Settings name the backend by its path,
``delayjobs.contrib.tasks.backend.DelayJobsBackend``.
"""
