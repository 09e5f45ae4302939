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
    for name in ("app", "openapi", "views", "urls"):
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
    assert reverse("delayjobs_api:openapi") in response.content.decode()


@pytest.mark.django_db
def test_what_ninja_would_take_differently_is_refused_as_before(client: Client) -> None:
    """Two answers a differential run against the hand-written parser found changed, kept:
    ninja reads a JSON null body as no body (a cancel passed), and pydantic lists unknown
    fields as sent, after the others (the API names them first, by name, object by
    object)."""
    from delayjobs.models import DelayedJob, JobStatus
    from tests.integration.test_admin import make_job
    from tests.integration.test_http_api import (
        ALL_PERMISSIONS,
        Api,
        assert_error,
        key_of,
        make_user,
    )

    api = Api(client, key_of(make_user(*ALL_PERMISSIONS)))
    job = make_job()
    response = api.post(f"jobs/{job.pk}/cancel/", None)
    assert_error(response, 400, "invalid", "The request must be a JSON object, got null.")
    assert DelayedJob.objects.get().status == JobStatus.SCHEDULED
    response = api.post("jobs/", {"job_type": "tests.scripted", "zz": 1, "aa": 2})
    assert_error(response, 400, "invalid", "Invalid schedule request. aa: Unknown field.")
    # Object by object: the first job's problem comes before the second's unknown field.
    jobs = [{"job_type": "tests.scripted", "priority": 1000}, {"zz": 1}]
    response = api.post("jobs/bulk/", {"jobs": jobs})
    assert_error(response, 400, "invalid", "request. jobs[0].priority: must be an integer")
