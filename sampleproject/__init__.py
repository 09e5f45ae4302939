"""A sample project using delayjobs: meetings (reminders, start, end, room requests), orders."""

# Loaded with Django, so that @shared_task functions bind to this app (Celery's pattern).
from sampleproject.celery import app as celery_app

__all__ = ["celery_app"]
