"""The HTTP API mounted where its how-to mounts it, so that its OpenAPI paths read the same."""

from django.urls import include, path

urlpatterns = [path("delayjobs/api/", include("delayjobs.http.urls"))]
