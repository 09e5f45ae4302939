from django.urls import path

from sampleproject.orders import views

app_name = "orders"

urlpatterns = [
    path("", views.order_list, name="list"),
    path("place/", views.order_place, name="place"),
    path("<int:pk>/pay/", views.order_pay, name="pay"),
]
