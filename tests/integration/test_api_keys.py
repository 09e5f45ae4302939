"""API keys: how they are stored, made (the command, the admin) and revoked, which job
types a key may list, and the check that warns when the HTTP API is mounted with no
public job type."""

from __future__ import annotations

import hashlib
import json
import re
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from delayjobs import api_keys as keys
from delayjobs.jobtypes import registry
from delayjobs.models import ApiKey
from tests.integration.http_client import ALL_PERMISSIONS, SCRIPTED, Api, make_user

pytestmark = pytest.mark.django_db

KEY_PATTERN = re.compile(r"dj_[0-9a-f]{12}_[A-Za-z0-9_-]{20,}")


def test_keys_store_only_the_digest_of_the_secret() -> None:
    key, plaintext = keys.create_api_key(make_user(), "svc")
    assert KEY_PATTERN.fullmatch(plaintext)
    prefix, secret = keys.split_key(plaintext) or ("", "")
    assert key.prefix == prefix
    assert key.digest == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in key.digest
    assert keys.find_key(plaintext) == key
    with pytest.raises(ValueError, match="name must be 1-100 characters"):
        keys.create_api_key(make_user(username="other"), "")


def test_create_delay_api_key_prints_a_working_key_once(client: Client) -> None:
    make_user(*ALL_PERMISSIONS, username="billing")
    stdout, stderr = StringIO(), StringIO()
    call_command(
        "create_delay_api_key",
        "--user",
        "billing",
        "--name",
        "billing svc",
        stdout=stdout,
        stderr=stderr,
    )
    plaintext = stdout.getvalue().strip()
    assert KEY_PATTERN.fullmatch(plaintext)
    assert "shown only this once" in stderr.getvalue()
    key = ApiKey.objects.get()
    assert (key.name, key.user.username) == ("billing svc", "billing")
    assert Api(client, plaintext).get("jobs/").status_code == 200


@pytest.mark.parametrize(
    ("username", "name", "message"),
    [
        ("ghost", "svc", "No user 'ghost'"),
        ("sleeper", "svc", "User 'sleeper' is inactive"),
        ("billing", "x" * 101, "name must be 1-100 characters"),
    ],
)
def test_create_delay_api_key_refuses_clearly(username: str, name: str, message: str) -> None:
    make_user(username="billing")
    make_user(username="sleeper", is_active=False)
    with pytest.raises(CommandError, match=message):
        call_command("create_delay_api_key", "--user", username, "--name", name)
    assert not ApiKey.objects.exists()


def test_the_admin_creates_a_key_shows_it_once_and_revokes_it(client: Client) -> None:
    client.force_login(User.objects.create_superuser("root", password="x"))
    service = make_user(*ALL_PERMISSIONS)
    response = client.post(
        reverse("admin:delayjobs_apikey_add"), {"user": service.pk, "name": "reports"}
    )
    assert response.status_code == 200
    plaintext = KEY_PATTERN.search(response.content.decode())[0]  # type: ignore[index]
    key = ApiKey.objects.get()
    assert (key.user, key.name) == (service, "reports")
    assert Api(Client(), plaintext).get("jobs/").status_code == 200
    for page in (
        client.get(reverse("admin:delayjobs_apikey_changelist")),
        client.get(reverse("admin:delayjobs_apikey_change", args=[key.pk])),
    ):
        assert page.status_code == 200
        assert key.prefix in page.content.decode()
        assert key.digest not in page.content.decode()
        assert plaintext not in page.content.decode()
    # Revoked by unticking "active" in the list (list_editable).
    response = client.post(
        reverse("admin:delayjobs_apikey_changelist"),
        {
            "form-TOTAL_FORMS": "1",
            "form-INITIAL_FORMS": "1",
            "form-0-id": str(key.pk),
            "_save": "Save",
        },
    )
    assert response.status_code == 302
    assert not ApiKey.objects.get().is_active
    assert Api(Client(), plaintext).get("jobs/").status_code == 401


def test_only_a_superuser_creates_keys_for_another_user(client: Client) -> None:
    staff = make_user("add_apikey", "view_apikey", username="staff", is_staff=True)
    client.force_login(staff)
    other = make_user(*ALL_PERMISSIONS, username="powerful")
    url = reverse("admin:delayjobs_apikey_add")
    response = client.post(url, {"user": other.pk, "name": "borrowed"})
    assert response.status_code == 200
    assert "Only a superuser may create a key for another user" in response.content.decode()
    assert not ApiKey.objects.exists()
    response = client.post(url, {"user": staff.pk, "name": "mine"})
    assert KEY_PATTERN.search(response.content.decode())
    assert ApiKey.objects.get().user == staff


def revoked_key_of(user: User, name: str = "old") -> ApiKey:
    key, _plaintext = keys.create_api_key(user, name)
    ApiKey.objects.filter(pk=key.pk).update(is_active=False)
    return ApiKey.objects.get(pk=key.pk)


def editable_list_post(client: Client, *keys_and_active: tuple[ApiKey, bool]) -> Any:
    """The key list's form posted, with "active" ticked or not on each key given."""
    data = {
        "form-TOTAL_FORMS": str(len(keys_and_active)),
        "form-INITIAL_FORMS": str(len(keys_and_active)),
        "_save": "Save",
    }
    for index, (key, active) in enumerate(keys_and_active):
        data[f"form-{index}-id"] = str(key.pk)
        if active:
            data[f"form-{index}-is_active"] = "on"
    return client.post(reverse("admin:delayjobs_apikey_changelist"), data)


def test_a_revoked_key_stays_revoked_even_for_a_superuser(client: Client) -> None:
    root = User.objects.create_superuser("root", password="x")
    client.force_login(root)
    key = revoked_key_of(make_user(*ALL_PERMISSIONS))
    page = client.get(reverse("admin:delayjobs_apikey_change", args=[key.pk]))
    assert 'name="is_active"' not in page.content.decode()  # shown, not editable
    client.post(
        reverse("admin:delayjobs_apikey_change", args=[key.pk]),
        {"name": "old", "is_active": "on"},
    )
    assert not ApiKey.objects.get(pk=key.pk).is_active
    editable_list_post(client, (key, True))
    assert not ApiKey.objects.get(pk=key.pk).is_active
    # Renaming it is still possible; it stays revoked.
    client.post(reverse("admin:delayjobs_apikey_change", args=[key.pk]), {"name": "renamed"})
    assert ApiKey.objects.values_list("name", "is_active").get(pk=key.pk) == ("renamed", False)


def test_staff_see_and_change_only_their_own_keys(client: Client) -> None:
    boss = User.objects.create_superuser("boss", password="x")
    boss_key, boss_plaintext = keys.create_api_key(boss, "boss key")
    revoked = revoked_key_of(boss, "boss old key")
    staff = make_user(
        "view_apikey", "change_apikey", "delete_apikey", username="staff", is_staff=True
    )
    own, _plaintext = keys.create_api_key(staff, "mine")
    client.force_login(staff)
    listed = client.get(reverse("admin:delayjobs_apikey_changelist")).content.decode()
    assert own.prefix in listed
    assert boss_key.prefix not in listed and revoked.prefix not in listed
    for key in (boss_key, revoked):
        for view in ("change", "delete"):
            response = client.get(reverse(f"admin:delayjobs_apikey_{view}", args=[key.pk]))
            assert response.status_code in (302, 403, 404)
            assert key.prefix not in response.content.decode()
        client.post(
            reverse("admin:delayjobs_apikey_change", args=[key.pk]),
            {"name": "hijacked", "is_active": "on" if key is revoked else ""},
        )
        client.post(reverse("admin:delayjobs_apikey_delete", args=[key.pk]), {"post": "yes"})
    editable_list_post(client, (boss_key, False), (revoked, True))
    assert list(ApiKey.objects.filter(user=boss).values_list("name", "is_active")) == [
        ("boss old key", False),
        ("boss key", True),
    ]
    assert Api(Client(), boss_plaintext).get("jobs/").status_code == 200
    # Their own key they may revoke, in the list.
    assert editable_list_post(client, (own, False)).status_code == 302
    assert not ApiKey.objects.get(pk=own.pk).is_active


def test_a_key_may_list_only_registered_job_types() -> None:
    user = make_user()
    with pytest.raises(ValueError, match="Unknown job types"):
        keys.create_api_key(user, "typo", ["tests.no_such_type"])
    with pytest.raises(CommandError, match="Unknown job types"):
        call_command(
            "create_delay_api_key", "--user", "service", "--name", "x", "--job-type", "nope"
        )
    assert not ApiKey.objects.exists()
    call_command(
        "create_delay_api_key",
        "--user",
        "service",
        "--name",
        "y",
        "--job-type",
        SCRIPTED,
        stdout=StringIO(),
        stderr=StringIO(),
    )
    assert ApiKey.objects.get().job_types == [SCRIPTED]


def test_only_a_superuser_sets_the_job_types_of_a_key_in_the_admin(client: Client) -> None:
    staff = make_user("add_apikey", "change_apikey", "view_apikey", username="staff")
    staff.is_staff = True
    staff.save()
    client.force_login(staff)
    response = client.post(
        reverse("admin:delayjobs_apikey_add"),
        {"user": staff.pk, "name": "mine", "job_types": json.dumps([SCRIPTED])},
    )
    assert "Only a superuser may let a key schedule private job types." in response.content.decode()
    assert not ApiKey.objects.exists()

    client.force_login(User.objects.create_superuser("root", password="x"))
    client.post(
        reverse("admin:delayjobs_apikey_add"),
        {"user": staff.pk, "name": "theirs", "job_types": json.dumps([SCRIPTED])},
    )
    assert ApiKey.objects.get().job_types == [SCRIPTED]


def test_w002_is_silent_for_settings_without_any_urls(settings: Any) -> None:
    # Consumers often run with a settings module of their own, without ROOT_URLCONF.
    from delayjobs.checks import check_http_api

    del settings.ROOT_URLCONF
    assert check_http_api() == []


def test_w002_when_the_api_is_mounted_and_no_job_type_is_public(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from delayjobs.checks import check_http_api

    assert check_http_api() == []  # tests.scripted is public
    for jobtype in registry:
        monkeypatch.setattr(type(jobtype), "public", False)
    assert [message.id for message in check_http_api()] == ["delayjobs.W002"]
