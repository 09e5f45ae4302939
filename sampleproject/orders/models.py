"""Orders: an unpaid order is closed a while after it was placed, unless it is paid first."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models, transaction
from django.utils import timezone

import delayjobs

#: The job type that closes an unpaid order (defined in ``delay_jobs.py``, which imports
#: this module; naming it here avoids the import cycle).
CLOSE_UNPAID_JOB = "orders.close_unpaid"


def payment_timeout() -> timedelta:
    return getattr(settings, "ORDER_PAYMENT_TIMEOUT", timedelta(minutes=30))


class Order(models.Model):
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

    @property
    def close_job_key(self) -> str:
        return f"order:{self.pk}:close"

    @classmethod
    def place(cls, customer: str, total: Decimal) -> Order:
        """Create an order and the job that closes it if it is still unpaid after the timeout."""
        # No on_commit needed: schedule() writes its row in this transaction, so the order
        # and its job exist together or not at all.
        with transaction.atomic():
            order = cls.objects.create(customer=customer, total=total)
            delayjobs.schedule(
                CLOSE_UNPAID_JOB,
                {"order_id": order.pk},
                delay=payment_timeout(),
                key=order.close_job_key,
                obj=order,  # shown on the order's admin page
            )
        return order

    def pay(self) -> bool:
        """Mark paid if still unpaid and cancel the close job; report whether it was paid."""
        with transaction.atomic():
            paid = self._transition(self.Status.PAID, paid_at=timezone.now())
            if paid:
                delayjobs.cancel(key=self.close_job_key)
        return paid

    def close_if_unpaid(self) -> bool:
        """Close if still unpaid; report whether it was closed."""
        return self._transition(self.Status.CLOSED, closed_at=timezone.now())

    def _transition(self, status: str, **fields: object) -> bool:
        # Conditional on "unpaid": paying and the close job may race; exactly one wins.
        changed = Order.objects.filter(pk=self.pk, status=self.Status.UNPAID).update(
            status=status, **fields
        )
        self.refresh_from_db(fields=["status", "paid_at", "closed_at"])
        return bool(changed)
