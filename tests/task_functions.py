"""A @task outside any ``tasks`` module, in a module of an installed app (``tests``), as a
project following Django's documentation may put one: consumers import it by its path."""

from __future__ import annotations

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task  # type: ignore[no-redef]


@task
def multiply(a: int, b: int) -> int:
    return a * b
