"""The admin of consumers: the processes that ran lately, read-only, with their heartbeats."""

from __future__ import annotations

from django.contrib import admin
from django.utils import timezone
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from delayjobs.admin.columns import moment_column
from delayjobs.admin.jobs import ReadOnlyMixin
from delayjobs.admin.lookups import RefusesNulInLists
from delayjobs.core.display import format_duration
from delayjobs.models import Consumer


@admin.register(Consumer)
class ConsumerAdmin(RefusesNulInLists, ReadOnlyMixin, admin.ModelAdmin):
    list_display = (
        "worker_id",
        "hostname",
        "pid",
        "queues",
        "concurrency",
        "started",
        "seen",
        "heartbeat_age",
        "processed",
        "database_mode",
    )
    list_filter = ("hostname", "database_mode")
    search_fields = ("worker_id", "hostname")
    actions = None
    started = moment_column(Consumer, "started_at")
    seen = moment_column(Consumer, "last_seen")

    @admin.display(description=_("last heartbeat"), ordering="last_seen")
    def heartbeat_age(self, consumer: Consumer) -> str:
        return gettext("%(duration)s ago") % {
            "duration": format_duration(timezone.now() - consumer.last_seen)
        }
