from __future__ import annotations

from django.apps import AppConfig
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

        autodiscover_modules(JOB_TYPES_MODULE)
