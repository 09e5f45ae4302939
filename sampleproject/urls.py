"""URLs of the sample project: the admin and the two apps' small UIs."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from delayjobs.http.app import api_docs

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="meetings:list"), name="home"),
    path("admin/", admin.site.urls),
    path("meetings/", include("sampleproject.meetings.urls")),
    path("orders/", include("sampleproject.orders.urls")),
    path("delayjobs/api/", include("delayjobs.http.urls")),
    # Swagger UI on the API's document (django-ninja's), for people trying the API out.
    path("delayjobs/api-docs/", api_docs, name="delayjobs-api-docs"),
]
