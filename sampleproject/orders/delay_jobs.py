"""The orders app's job type."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import delayjobs
from sampleproject.orders.models import CLOSE_UNPAID_JOB, Order

if TYPE_CHECKING:
    from delayjobs.models import DelayedJob

log = logging.getLogger(__name__)


@delayjobs.register
class CloseUnpaidOrder(delayjobs.JobType):
    name = CLOSE_UNPAID_JOB

    def execute(self, job: DelayedJob) -> None:
        # Idempotent: a paid, closed or deleted order is left alone.
        order = Order.objects.filter(pk=job.payload["order_id"]).first()
        if order is not None and order.close_if_unpaid():
            log.info("Order %s was not paid in time: closed", order.pk)
