"""The checks Django runs: of the DELAYJOBS settings, the registered job types and the HTTP
API. Registered with ``checks.register`` when this module is imported (by the package).

``run_delay_consumer`` runs only the checks tagged ``CONSUMER_CHECKS``, what a consumer
reads, before it claims anything: Django's own checks would import the project's URLconf
(the admin, the HTTP API, every view) in a process that serves none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from delayjobs.checks.limits import check_limits
from delayjobs.checks.redis import check_redis
from delayjobs.checks.settings import check_window, read_each
from delayjobs.conf import DEFAULTS, configured
from delayjobs.jobtypes import (
    JobType,
    code_recurrence_problems,
    registry,
    validate_declaration,
)

#: The tag of the checks a consumer runs at start: the settings and the job types it reads.
CONSUMER_CHECKS = "delayjobs_consumer"


@checks.register("delayjobs", CONSUMER_CHECKS)
def check_settings(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    value = getattr(django_settings, "DELAYJOBS", {})
    if not isinstance(value, dict):
        return [
            checks.Error(
                f"DELAYJOBS must be a dict, got {type(value).__name__}.",
                hint="DELAYJOBS = {'REDIS_URL': 'redis://127.0.0.1:6379/0'}",
                id="delayjobs.E001",
            )
        ]
    config = configured()
    messages, values = read_each(config)
    messages += check_redis(config, values)
    messages += check_window(values)
    if not getattr(django_settings, "USE_TZ", False):
        messages.append(
            checks.Error(
                "delayjobs needs USE_TZ = True: job times are compared across processes and "
                "hosts, which only aware datetimes make safe.",
                hint="Set USE_TZ = True in your settings.",
                id="delayjobs.E008",
            )
        )
    for name in sorted(set(config) - set(DEFAULTS), key=repr):  # keys of any type
        messages.append(
            checks.Warning(
                f"DELAYJOBS[{name!r}] is not a delayjobs setting; it is ignored.",
                hint=f"Known settings: {', '.join(sorted(DEFAULTS))}.",
                id="delayjobs.W001",
            )
        )
    return messages


@checks.register("delayjobs", CONSUMER_CHECKS)
def check_job_types(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Every registered job type's declaration, again: ``@register`` refuses a bad one at
    import, but a class attribute changed afterwards (read from a setting, say) must not
    reach a consumer, where an unbounded ``time_to_run`` overflows at the first claim."""
    messages: list[checks.CheckMessage] = []
    for jobtype in registry:
        try:
            validate_declaration(type(jobtype))
        except ImproperlyConfigured as exc:
            messages.append(
                checks.Error(
                    str(exc),
                    hint="Fix the job type's class attribute; the bounds keep leases and "
                    "retries within what dates can hold.",
                    id="delayjobs.E101",
                )
            )
        messages += check_recurrence(jobtype)
    return messages + check_limits(registry)


def check_recurrence(jobtype: JobType) -> list[checks.Error]:
    """A job type's ``recurrence``, ``misfire`` and ``misfire_grace``: nothing ticks from a
    bad one, so the check says why before a deploy finds out by missing jobs."""
    label = f"{type(jobtype).__module__}.{type(jobtype).__qualname__}"
    return [
        checks.Error(
            f"{label}: {problem}",
            hint="See docs/howto/recurring.md. Until it is fixed, no job of this type is "
            "made from its recurrence.",
            id="delayjobs.E102",
        )
        for problem in code_recurrence_problems(jobtype)
    ]


@checks.register("delayjobs", checks.Tags.urls)
def check_http_api(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[checks.Warning]:
    """The HTTP API mounted with no public job type: only keys listing job types can
    schedule anything, which after the upgrade that made job types private is a surprise."""
    if not _http_api_mounted() or any(jobtype.public for jobtype in registry):
        return []
    return [
        checks.Warning(
            "The HTTP API (delayjobs.http.urls) is mounted, but no job type is public: API "
            "keys can schedule only the private job types listed on them.",
            hint="Set public = True on the job types any key may schedule, or list them on "
            "each key (create_delay_api_key --job-type NAME, or the key's page in the admin).",
            id="delayjobs.W002",
        )
    ]


def _http_api_mounted() -> bool:
    from django.urls import NoReverseMatch, reverse

    try:
        reverse("delayjobs_api:not-found")
    except NoReverseMatch:
        return False
    except Exception:
        # No URLconf at all (a settings module for consumers only) or a broken one, which
        # Django's own checks report: either way, nothing of delayjobs is mounted to judge.
        return False
    return True
