"""The HTTP API is an extra: without django-ninja it refuses to load, naming the extra,
while keys (their admin and command) need nothing of it."""

from __future__ import annotations

import sys

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from django.urls import reverse


def test_without_django_ninja_the_api_names_the_http_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # None in sys.modules makes "import ninja" fail as if it were not installed.
    monkeypatch.setitem(sys.modules, "ninja", None)
    for name in ("delayjobs.http.app", "delayjobs.http.views", "delayjobs.http.urls"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ImproperlyConfigured, match=r"django-delayjobs\[http\]"):
        import delayjobs.http.urls
    # Keys are made and checked without it.
    monkeypatch.delitem(sys.modules, "delayjobs.http.keys", raising=False)
    import delayjobs.http.keys  # noqa: F401


@pytest.mark.django_db
def test_swagger_ui_reads_the_apis_own_document(client: Client) -> None:
    """django-ninja's interactive docs, on the document the API serves (mounted by the
    sample project at delayjobs/api-docs/)."""
    response = client.get(reverse("delayjobs-api-docs"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    assert reverse("delayjobs_api:openapi") in response.content.decode()
