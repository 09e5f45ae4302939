from django import forms

from sampleproject.orders.models import Order


class PlaceOrderForm(forms.ModelForm):
    class Meta:
        model = Order
        fields = ["customer", "total"]
