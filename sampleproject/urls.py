"""URLs of the sample project: the admin and the two apps' small UIs."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="meetings:list"), name="home"),
    path("admin/", admin.site.urls),
    path("meetings/", include("sampleproject.meetings.urls")),
    path("orders/", include("sampleproject.orders.urls")),
    path("delayjobs/api/", include("delayjobs.http.urls")),
]
