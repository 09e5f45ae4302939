"""What the sample apps' models share: saves that commit together with their jobs, and
decisions (an order paid) that race safely with the job that would decide otherwise."""

from __future__ import annotations

from typing import Any

from django.db import models, transaction


class SavedWithJobs(models.Model):
    """Saves in one transaction with the jobs that its ``delayjobs.bind`` bindings schedule,
    move or cancel from ``post_save``, whoever calls ``save()``: without it, in autocommit,
    the row could commit and its job fail to."""

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        with transaction.atomic(using=kwargs.get("using")):
            super().save(*args, **kwargs)


def save_if_status(instance: models.Model, expected: str, **changes: Any) -> bool:
    """Apply ``changes`` to ``instance``'s row if its status is still ``expected``; report
    whether it was.

    With ``save()``, so that bindings see the change (``when`` turning false cancels the
    job), under a row lock: the job racing this decision changes the row with an UPDATE
    conditional on the same status, so exactly one of the two wins.
    """
    with transaction.atomic():
        row = type(instance)._default_manager.select_for_update().get(pk=instance.pk)
        decided = row.status == expected
        if decided:
            for name, value in changes.items():
                setattr(row, name, value)
            row.save(update_fields=list(changes))
    for name in changes.keys() | {"status"}:
        setattr(instance, name, getattr(row, name))
    return decided
