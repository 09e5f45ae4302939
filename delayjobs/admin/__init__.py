"""The Django admin of delayjobs (interfaces): jobs and their attempts, the actions on
them, pauses, recurring schedules, consumers, API keys, the dashboard, and the jobs inline
for any object. It acts only through the public API (``delayjobs.api``, ``pauses``,
``recurring.definitions``, ``api.stats``, ``api_keys``), reads the models, and never
imports the HTTP API. Django's autodiscover imports this package: the submodules imported
here register every ModelAdmin.
"""

from delayjobs.admin import api_keys, consumers, pauses, schedules
from delayjobs.admin.inlines import DelayedJobInline
from delayjobs.admin.jobs import DelayedJobAdmin

__all__ = [
    "DelayedJobAdmin",
    "DelayedJobInline",
    "api_keys",
    "consumers",
    "pauses",
    "schedules",
]
