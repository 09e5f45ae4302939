"""The checks of the job types' fleet-wide limits: each type's values (delayjobs.E021), a
group whose members disagree (delayjobs.E022), a key or group with no limit (E023)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from django.core import checks

from delayjobs.jobtypes import JobType, limit_problems, limits_of

HINT = "See docs/howto/limits.md and docs/reference/job-types.md."


def check_limits(jobtypes: Iterable[JobType]) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    members: dict[str, list[JobType]] = defaultdict(list)
    for jobtype in jobtypes:
        label = _label(jobtype)
        problems = limit_problems(type(jobtype))
        messages += [
            checks.Error(f"{label}.{problem}", hint=HINT, id="delayjobs.E021")
            for problem in problems
        ]
        if problems:
            continue
        limits = limits_of(jobtype)
        if limits is None:
            declared = _declared_without_limit(jobtype)
            if declared:
                messages.append(
                    checks.Error(
                        f"{label} declares {declared} but neither global_concurrency nor "
                        f"rate_limit: it limits nothing.",
                        hint="Declare a limit, or remove it. " + HINT,
                        id="delayjobs.E023",
                    )
                )
            continue
        members[limits.group].append(jobtype)
    for group, types in sorted(members.items()):
        if len({(t.global_concurrency, t.rate_limit) for t in types}) > 1:
            each = "; ".join(
                f"{_label(t)}: global_concurrency={t.global_concurrency!r}, "
                f"rate_limit={t.rate_limit!r}"
                for t in types
            )
            messages.append(
                checks.Error(
                    f"The job types of limit group {group!r} declare different limits ({each}).",
                    hint="A group shares one limit: give every member the same "
                    "global_concurrency and rate_limit. " + HINT,
                    id="delayjobs.E022",
                )
            )
    return messages


def _declared_without_limit(jobtype: JobType) -> str:
    declared = []
    if type(jobtype).limit_key is not JobType.limit_key:
        declared.append("limit_key()")
    if jobtype.limit_group is not None:
        declared.append("limit_group")
    return " and ".join(declared)


def _label(jobtype: JobType) -> str:
    return f"{type(jobtype).__module__}.{type(jobtype).__qualname__}"
