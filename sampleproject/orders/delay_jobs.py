"""The orders app's job type, and the binding that gives every unpaid order its close job."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

import delayjobs
from sampleproject.orders.models import Order, payment_timeout

if TYPE_CHECKING:
    from delayjobs.bindings import Binding
    from delayjobs.models import DelayedJob

log = logging.getLogger(__name__)


@delayjobs.register
class CloseUnpaidOrder(delayjobs.JobType):
    name = "orders.close_unpaid"
    #: One job per order, due ``payment_timeout()`` after it was placed, while it is unpaid.
    binding: ClassVar[Binding]

    @staticmethod
    def timeout(order: Order) -> timedelta:
        # Read at each save rather than once at startup, so that settings can change it.
        return payment_timeout()

    @staticmethod
    def is_unpaid(order: Order) -> bool:
        return order.status == Order.Status.UNPAID

    @staticmethod
    def payload(order: Order) -> dict[str, Any]:
        return {"order_id": order.pk}

    def should_run(self, job: DelayedJob) -> bool:
        # Paying cancels the job through the binding; an order paid once the job was already
        # on its way (or behind the binding's back, with update()) still is not closed: the
        # job ends "skipped", which says so in the admin.
        return Order.objects.filter(pk=job.payload["order_id"], status=Order.Status.UNPAID).exists()

    def execute(self, job: DelayedJob) -> None:
        # Idempotent: a paid, closed or deleted order is left alone.
        order = Order.objects.filter(pk=job.payload["order_id"]).first()
        if order is not None and order.close_if_unpaid():
            log.info("Order %s was not paid in time: closed", order.pk)


CloseUnpaidOrder.binding = delayjobs.bind(
    Order,
    "created_at",
    job_type=CloseUnpaidOrder,
    offset=CloseUnpaidOrder.timeout,
    when=CloseUnpaidOrder.is_unpaid,
    payload=CloseUnpaidOrder.payload,
)
