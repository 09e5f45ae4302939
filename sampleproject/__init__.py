"""A sample project using delayjobs: meetings (reminders, start, end), unpaid orders closed."""

import importlib.util

# Celery's pattern: load the Celery app with Django, so that @shared_task functions bind to
# it. Celery is optional here (the `celery` extra): the demo and the local executor run
# without it, and `run_delay_consumer --executor celery` says so when it is missing.
if importlib.util.find_spec("celery") is not None:
    from sampleproject.celery import app as celery_app

    __all__ = ["celery_app"]
