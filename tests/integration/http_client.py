"""What the HTTP API's tests share: a client that checks every reply against the OpenAPI
document, users and keys, and the assertion of an error by status, code and field paths
(never by wording, which may change)."""

from __future__ import annotations

import functools
import json
import re
from typing import Any
from urllib.parse import urlencode, urlsplit

from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.test import Client
from jsonschema import Draft202012Validator

from delayjobs import api_keys as keys
from delayjobs.http.app import api
from delayjobs.models import DelayedJob, JobAttempt

BASE = "/delayjobs/api/"
JSON = "application/json"
SCRIPTED = "tests.scripted"
NOTHING = object()
CHALLENGE = 'Bearer realm="delayjobs"'
ALL_PERMISSIONS = (
    "view_delayedjob",
    "add_delayedjob",
    "cancel_delayedjob",
    "reschedule_delayedjob",
    "retry_delayedjob",
)


@functools.cache
def document() -> dict[str, Any]:
    return json.loads(json.dumps(api.get_openapi_schema()))


def documented_operation(method: str, path: str) -> dict[str, Any] | None:
    """The document's operation of ``method`` on ``path``; None if the path is not in it.
    {} for a method the path does not take."""
    for template, methods in document()["paths"].items():
        if re.fullmatch(re.sub(r"\{\w+\}", "[0-9]+", template), path):
            return methods.get("get" if method == "HEAD" else method.lower(), {})
    return None


def assert_documented(method: str, url: str, response: Any) -> None:
    """The reply is JSON, its status is documented for its operation, and its body
    matches the schema the document gives it. OPTIONS is a 204 with Allow, HEAD a GET
    without the body, a method a URL does not take a 405 with Allow, and a URL of no
    operation (but the document's) a 404."""
    operation = documented_operation(method, urlsplit(url).path)
    if method == "OPTIONS" and operation is not None:
        assert (response.status_code, response.content) == (204, b"")
        assert "OPTIONS" in response["Allow"]
        return
    assert response["Content-Type"].split(";")[0] == JSON, response
    if operation is None:
        if urlsplit(url).path == f"{BASE}openapi.json":  # ninja's own: not in the document
            return
        assert response.status_code == 404
        schema: dict[str, Any] = {"$ref": "#/components/schemas/Error"}
    elif not operation:
        assert (response.status_code, "Allow" in response) == (405, True)
        schema = {"$ref": "#/components/schemas/Error"}
    else:
        status = str(response.status_code)
        assert status in operation["responses"], f"{method} {url}: {status} undocumented"
        schema = operation["responses"][status]["content"][JSON]["schema"]
    if method == "HEAD":
        assert response.content == b""  # the test client drops it, as servers do
        return
    components = document()["components"]
    validator = Draft202012Validator(
        {**schema, "components": components}, format_checker=Draft202012Validator.FORMAT_CHECKER
    )
    validator.validate(response.json())


class Api:
    """A test client speaking to the API, with a key (or a session), checking each reply."""

    def __init__(self, client: Client, key: str | None = None) -> None:
        self.client = client
        self.key = key

    def request(
        self,
        method: str,
        route: str,
        body: Any = NOTHING,
        *,
        raw: bytes | None = None,
        content_type: str = JSON,
        headers: dict[str, str] | None = None,
        **query: Any,
    ) -> Any:
        sent = dict(headers or {})
        if self.key is not None:
            sent.setdefault("authorization", f"Bearer {self.key}")
        data = raw if raw is not None else b"" if body is NOTHING else json.dumps(body).encode()
        url = BASE + route + (f"?{urlencode(query, doseq=True)}" if query else "")
        response = self.client.generic(method, url, data, content_type=content_type, headers=sent)
        assert_documented(method, url, response)
        return response

    def get(self, route: str, **query: Any) -> Any:
        return self.request("GET", route, **query)

    def post(self, route: str, body: Any = NOTHING, **options: Any) -> Any:
        return self.request("POST", route, body, **options)


def assert_error(response: Any, status: int, code: str, *fields: str) -> dict[str, Any]:
    """An error reply: its status, its code, and exactly these field paths at fault."""
    body = response.json()
    assert (response.status_code, body["error"]) == (status, code), body
    assert sorted(body["fields"]) == sorted(fields), body
    return dict(body)


def make_user(*permissions: str, username: str = "service", **fields: Any) -> User:
    user = User.objects.create_user(username, password="x", **fields)
    user.user_permissions.add(*Permission.objects.filter(codename__in=permissions))
    return user


def key_of(user: User, *job_types: str) -> str:
    return keys.create_api_key(user, "tests", job_types)[1]


def rows() -> list[dict[str, Any]]:
    """Every job and attempt, to show that a refused request changed nothing."""
    jobs = list(DelayedJob.objects.order_by("pk").values())
    return jobs + list(JobAttempt.objects.order_by("pk").values())


def log_entries() -> list[tuple[int, str, int, str]]:
    """(job id, username, action flag, message) of every admin log entry about a job."""
    entries = LogEntry.objects.filter(
        content_type=ContentType.objects.get_for_model(DelayedJob)
    ).order_by("pk")
    return [
        (int(entry.object_id), entry.user.username, entry.action_flag, entry.change_message)
        for entry in entries
    ]
