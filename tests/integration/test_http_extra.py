"""The HTTP API is an extra: without django-ninja it refuses to load, naming the extra,
while keys (their admin and command) need nothing of it."""

from __future__ import annotations

import importlib
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from django.urls import reverse

from delayjobs import http as http_package


def test_without_django_ninja_the_api_names_the_http_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # None in sys.modules makes "import ninja" fail as if it were not installed.
    monkeypatch.setitem(sys.modules, "ninja", None)
    for name in ("app", "errors", "auth", "schemas", "views", "urls"):
        # Imported again: from the package's attributes too, which "from . import" reads.
        monkeypatch.delitem(sys.modules, f"delayjobs.http.{name}", raising=False)
        monkeypatch.delattr(http_package, name, raising=False)
    with pytest.raises(ImproperlyConfigured, match=r"django-delayjobs\[http\]"):
        importlib.import_module("delayjobs.http.urls")
    # Keys are made and checked without it.
    monkeypatch.delitem(sys.modules, "delayjobs.api_keys", raising=False)
    importlib.import_module("delayjobs.api_keys")


@pytest.mark.django_db
def test_swagger_ui_reads_the_apis_own_document(client: Client) -> None:
    """django-ninja's interactive docs, on the document the API serves (mounted by the
    sample project at delayjobs/api-docs/)."""
    response = client.get(reverse("delayjobs-api-docs"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    assert reverse("delayjobs_api:openapi-json") in response.content.decode()
