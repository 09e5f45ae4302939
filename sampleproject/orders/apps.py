from django.apps import AppConfig


class OrdersConfig(AppConfig):
    name = "sampleproject.orders"
    label = "orders"
    verbose_name = "Orders"
