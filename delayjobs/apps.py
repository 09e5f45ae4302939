from __future__ import annotations

from django.apps import AppConfig
from django.conf import global_settings, settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules
from django.utils.translation import gettext_lazy as _

#: Module that holds job types in each installed app.
JOB_TYPES_MODULE = "delay_jobs"


class DelayJobsConfig(AppConfig):
    # The label is permanent: migrations and permissions are recorded under it.
    name = "delayjobs"
    label = "delayjobs"
    verbose_name = _("Delayed jobs")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from delayjobs import checks  # noqa: F401  (registers the system checks)
        from delayjobs.core import db  # noqa: F401  (notes, before any, which threads connect)

        autodiscover_modules(JOB_TYPES_MODULE)
        _register_task_job_type()


def _register_task_job_type() -> None:
    """Register the ``django.task`` job type when the project uses Django's Tasks framework.

    Consumers must know it before a task is enqueued anywhere, whichever alias (or
    subclass of ``DelayJobsBackend``) enqueues it; registering it where no alias does is
    harmless, as no such job is ever written there. Projects without ``TASKS`` neither get
    it nor import the framework.
    """
    tasks = getattr(settings, "TASKS", None)
    # Django 6's default TASKS (the immediate backend) is no choice of the project's.
    if not tasks or tasks == getattr(global_settings, "TASKS", None):
        return
    try:
        import delayjobs.contrib.tasks.backend  # noqa: F401  (registers the job type)
    except ImproperlyConfigured:
        # No Tasks framework installed: an error only if TASKS names delayjobs' backend.
        if any(
            isinstance(config, dict) and str(config.get("BACKEND", "")).startswith("delayjobs.")
            for config in (tasks.values() if isinstance(tasks, dict) else ())
        ):
            raise
