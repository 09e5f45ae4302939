"""The sample project's Celery app: delayjobs' pre-loader from beat and, with
``run_delay_consumer --executor celery``, the jobs themselves in Celery's workers.

    celery -A sampleproject worker --pool threads --concurrency 8
    celery -A sampleproject beat
    python manage.py run_delay_consumer --executor celery --no-preload
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sampleproject.settings")

app = Celery("sampleproject")
# Every CELERY_* Django setting configures the app (CELERY_BROKER_URL ...).
app.config_from_object("django.conf:settings", namespace="CELERY")
# Finds delayjobs.tasks (preload, execute) and any installed app's tasks module.
app.autodiscover_tasks()
