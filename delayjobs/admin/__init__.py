"""The Django admin of delayjobs (layer 7, interfaces): jobs and their attempts, the actions
on them, pauses, recurring schedules, consumers, API keys, the dashboard, and the jobs
inline for any object. It acts only through the public API (``delayjobs.api``, ``pauses``,
``schedules``, ``stats``), reads the models, and of the HTTP API imports only
``delayjobs.http.keys``. Django's autodiscover imports this package: the submodules
imported here register every ModelAdmin.
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
