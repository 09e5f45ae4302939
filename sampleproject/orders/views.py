"""Orders UI: list, place (its binding schedules the close job), pay (which cancels it)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from sampleproject.orders.forms import PlaceOrderForm
from sampleproject.orders.models import Order, payment_timeout


def _render_orders(
    request: HttpRequest, form: PlaceOrderForm | None = None, status: int = 200
) -> HttpResponse:
    context = {
        "orders": Order.objects.all(),
        "form": form or PlaceOrderForm(),
        "timeout_minutes": payment_timeout().total_seconds() / 60,
    }
    return render(request, "orders/order_list.html", context, status=status)


@require_GET
def order_list(request: HttpRequest) -> HttpResponse:
    return _render_orders(request)


@require_POST
def order_place(request: HttpRequest) -> HttpResponse:
    form = PlaceOrderForm(request.POST)
    if not form.is_valid():
        return _render_orders(request, form, status=400)
    order = form.save()  # its binding schedules the close job, in the same transaction
    messages.success(request, f"Order {order.pk} placed; it closes unless paid in time.")
    return redirect("orders:list")


@require_POST
def order_pay(request: HttpRequest, pk: int) -> HttpResponse:
    order = get_object_or_404(Order, pk=pk)
    if order.pay():
        messages.success(request, f"Order {pk} paid; its close job is cancelled.")
    else:
        messages.error(request, f"Order {pk} is {order.status}; it cannot be paid.")
    return redirect("orders:list")
