"""The Django Tasks backend (``DelayJobsBackend``) and the ``django.task`` job type, layer 6.

Order inside: compat <- base <- discovery <- results <- jobs <- backend. Imports layers 0-4
and the name modules ``delayjobs.task_jobs`` / ``delayjobs.task_index`` (the class paths
stored in task results); never ``contrib.celery``. Settings name the backend by its
documented path, ``delayjobs.contrib.tasks.backend.DelayJobsBackend``.
"""
