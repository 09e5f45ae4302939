from django.contrib import admin

from delayjobs.admin import DelayedJobInline
from sampleproject.orders.models import Order


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ["pk", "customer", "total", "status", "created_at", "paid_at", "closed_at"]
    list_filter = ["status"]
    search_fields = ["customer"]
    readonly_fields = ["created_at", "paid_at", "closed_at"]
    actions = ["pay"]
    # The order's close-if-unpaid job: when it is due, or what became of it.
    inlines = [DelayedJobInline]

    @admin.action(description="Mark selected unpaid orders paid")
    def pay(self, request, queryset) -> None:
        paid = sum(order.pay() for order in queryset)
        self.message_user(request, f"{paid} order(s) paid.")
