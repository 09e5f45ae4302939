"""Orders: an unpaid order is closed a while after it was placed, unless it is paid first.

The close job is bound to ``created_at`` in ``delay_jobs.py``: placing an order schedules
it, paying the order cancels it.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from sampleproject.common import SavedWithJobs, save_if_status


def payment_timeout() -> timedelta:
    return getattr(settings, "ORDER_PAYMENT_TIMEOUT", timedelta(minutes=30))


class Order(SavedWithJobs):
    class Status(models.TextChoices):
        UNPAID = "unpaid", "Unpaid"
        PAID = "paid", "Paid"
        CLOSED = "closed", "Closed"

    customer = models.CharField(max_length=100)
    total = models.DecimalField(
        max_digits=10, decimal_places=2, validators=[MinValueValidator(Decimal("0.01"))]
    )
    status = models.CharField(max_length=10, choices=Status, default=Status.UNPAID)
    created_at = models.DateTimeField(default=timezone.now)
    paid_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"Order {self.pk} of {self.customer} ({self.status})"

    def pay(self) -> bool:
        """Mark paid if still unpaid; report whether it was paid. Its close job's binding
        sees "unpaid" turn false and cancels the job (``delay_jobs.py``)."""
        return save_if_status(
            self, self.Status.UNPAID, status=self.Status.PAID, paid_at=timezone.now()
        )

    def close_if_unpaid(self) -> bool:
        """Close if still unpaid; report whether it was closed. Called by the close job."""
        # Conditional UPDATE: paying may race this; exactly one wins (see save_if_status).
        changed = Order.objects.filter(pk=self.pk, status=self.Status.UNPAID).update(
            status=self.Status.CLOSED, closed_at=timezone.now()
        )
        self.refresh_from_db(fields=["status", "paid_at", "closed_at"])
        return bool(changed)
