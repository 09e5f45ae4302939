"""Hostile input to the admin: property-based (Hypothesis).

Whatever a staff user types or a forged request sends, the admin answers a page (200) or
a redirect (302), never a server error (the test client re-raises any exception a view
raises): a form either makes a valid change or shows an error having written nothing.
The forms: the reschedule action's time, a pause, an API key; and the job list's query
parameters (search, filters, date hierarchy, ordering, page).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from hypothesis import event, given
from hypothesis import strategies as st

from delayjobs.conf import settings as conf
from delayjobs.jobtypes import registry
from delayjobs.models import ApiKey, DelayedJob, JobAttempt, Pause
from tests.integration.test_admin import CHANGELIST, make_job
from tests.utils import fuzz_settings

pytestmark = pytest.mark.django_db

EXAMPLES = fuzz_settings(max_examples=60)

#: What a browser or a forged request can put in a form field: any text a request can
#: carry (no lone surrogates: they cannot be encoded), NUL included.
FORM_TEXT = st.text(st.characters(codec="utf-8"), max_size=30) | st.sampled_from(
    ["", " ", "\x00", "a\x00b", "9" * 5000, "-1", "0", "é" * 200]
)


@pytest.fixture
def superuser(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("root", "root@example.com", "x"))
    return client


def database_rows() -> list[list[dict[str, Any]]]:
    """Every row the admin's forms could write, to show that a refusal wrote nothing."""
    return [
        list(model.objects.order_by("pk").values())
        for model in (DelayedJob, JobAttempt, Pause, ApiKey)
    ]


def answered(response: Any) -> int:
    """The status, which must be a page or a redirect."""
    event(f"answered {response.status_code}")
    assert response.status_code in (200, 302), response.status_code
    return response.status_code


# The reschedule action ---------------------------------------------------------------

#: Times as a datetime-local input sends them, and what a forged request might.
RUN_AT_TEXT = st.one_of(
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31)).map(
        lambda moment: moment.strftime("%Y-%m-%dT%H:%M:%S")
    ),
    st.sampled_from(
        [
            "9999-12-31T23:59:59",
            "0001-01-01T00:00:00",
            "99999-01-01T00:00",
            "2030-02-30T10:00",
            "2030-01-15T25:00",
            "2030-01-15T14:30:00+23:59",
            "2030-01-15T14:30:00-23:59",
            "2030-01-15 14:30",
        ]
    ),
    st.just("future"),
    # Valid times: after now, within MAX_SCHEDULE_AHEAD.
    st.datetimes(min_value=datetime(2027, 1, 1), max_value=datetime(2120, 12, 31)).map(
        lambda moment: moment.strftime("%Y-%m-%dT%H:%M:%S")
    ),
    FORM_TEXT,
)


def resolve_text(text: str) -> str:
    """ "future" stands for a valid time an hour from now, in the current time zone."""
    if text != "future":
        return text
    return timezone.localtime(timezone.now() + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")


@EXAMPLES
@given(text=RUN_AT_TEXT)
def test_any_reschedule_time_moves_the_job_validly_or_shows_an_error(
    superuser: Client, text: str
) -> None:
    job = make_job(delay=timedelta(days=1))
    before = database_rows()
    sent = resolve_text(text)
    data = {"action": "reschedule_jobs", "_selected_action": [str(job.pk)], "post": "yes"}
    response = superuser.post(reverse(CHANGELIST), {**data, "run_at": sent})
    if answered(response) == 200:  # the page again, with the form's error
        assert response.context["form"].errors, "a page without a redirect shows an error"
        assert database_rows() == before
        return
    job.refresh_from_db()
    assert job.run_at <= timezone.now() + conf.MAX_SCHEDULE_AHEAD
    typed = datetime.fromisoformat(sent)
    if timezone.is_naive(typed):  # what a datetime-local input sends: the current zone's
        typed = timezone.make_aware(typed)
    assert job.run_at == typed, "moved to the very time typed"


# Pauses ------------------------------------------------------------------------------


@EXAMPLES
@given(
    kind=st.sampled_from(["queue", "job_type"]) | FORM_TEXT,
    name=st.sampled_from(["default", "tests.scripted", "a b", "x" * 101]) | FORM_TEXT,
)
def test_any_pause_form_pauses_a_real_target_or_shows_an_error(
    superuser: Client, kind: str, name: str
) -> None:
    before = database_rows()
    response = superuser.post(reverse("admin:delayjobs_pause_add"), {"kind": kind, "name": name})
    if answered(response) == 200:
        assert response.context["adminform"].form.errors
        assert database_rows() == before
        return
    pause = Pause.objects.get()
    if pause.kind == "job_type":
        assert pause.name in registry.names()
    pause.delete()  # the next example starts with no pause


# API keys ----------------------------------------------------------------------------

#: The key's job types, as typed into its JSON field.
JOB_TYPES_TEXT = st.one_of(
    st.lists(st.sampled_from(registry.names() or ["none"]) | FORM_TEXT, max_size=3).map(json.dumps),
    st.sampled_from(
        [
            "",
            "[]",
            "null",
            "{}",
            '"tests.scripted"',
            "[" * 10_000 + "]" * 10_000,
            "[1e400]",
            "[" + "9" * 5000 + "]",
            '["\\u0000"]',
            "not json",
        ]
    ),
    FORM_TEXT,
)


@EXAMPLES
@given(name=FORM_TEXT, job_types=JOB_TYPES_TEXT)
def test_any_api_key_form_creates_a_valid_key_or_shows_an_error(
    superuser: Client, name: str, job_types: str
) -> None:
    user = User.objects.get(username="root")
    before = database_rows()
    response = superuser.post(
        reverse("admin:delayjobs_apikey_add"),
        {"user": str(user.pk), "name": name, "job_types": job_types, "is_active": "on"},
    )
    answered(response)
    event("refused" if "adminform" in response.context else "created")
    if "adminform" in response.context:  # the form again, with its errors
        assert response.context["adminform"].form.errors
        assert database_rows() == before
        return
    # Created: the page that shows the new key once.
    key = ApiKey.objects.get()
    assert key.prefix in response.content.decode()
    assert isinstance(key.job_types, list)
    assert all(job_type in registry.names() for job_type in key.job_types)
    key.delete()


# The job list ------------------------------------------------------------------------

LIST_PARAMETERS: dict[str, st.SearchStrategy[str]] = {
    "q": FORM_TEXT,
    "status__exact": st.sampled_from(["scheduled", "failed"]) | FORM_TEXT,
    "job_type__exact": st.sampled_from(["tests.scripted"]) | FORM_TEXT,
    "queue__exact": st.sampled_from(["default"]) | FORM_TEXT,
    "run_at__year": st.sampled_from(["2030", "0", "-1", "99999", "9999"]) | FORM_TEXT,
    "run_at__month": st.sampled_from(["1", "13", "0"]) | FORM_TEXT,
    "run_at__day": st.sampled_from(["1", "31", "32"]) | FORM_TEXT,
    "o": st.sampled_from(["1", "-2", "99", "1.2"]) | FORM_TEXT,
    "p": st.sampled_from(["1", "2", "0", "-1", "9" * 30]) | FORM_TEXT,
    "due": FORM_TEXT,
}


@EXAMPLES
@given(
    query=st.dictionaries(
        st.sampled_from(sorted(LIST_PARAMETERS)), st.just(""), max_size=4
    ).flatmap(lambda names: st.fixed_dictionaries({name: LIST_PARAMETERS[name] for name in names}))
)
def test_any_job_list_query_shows_a_page_or_redirects(
    listed_job: DelayedJob, superuser: Client, query: dict[str, str]
) -> None:
    answered(superuser.get(reverse(CHANGELIST), query))


@pytest.fixture
def listed_job() -> DelayedJob:
    """A job to list, with a key and a payload for the search to look through."""
    return make_job(delay=timedelta(days=1), key="k:1", payload={"a": 1})


#: The other lists of delayjobs' admin, and the query parameters each takes.
OTHER_LISTS = {
    "admin:delayjobs_apikey_changelist": ("q", "is_active__exact", "o", "p"),
    "admin:delayjobs_pause_changelist": ("kind__exact", "o", "p"),
    "admin:delayjobs_consumer_changelist": ("q", "o", "p"),
}


@EXAMPLES
@given(
    data=st.data(),
    url_name=st.sampled_from(sorted(OTHER_LISTS)),
)
def test_any_query_of_the_other_lists_shows_a_page_or_redirects(
    superuser: Client, data: st.DataObject, url_name: str
) -> None:
    names = data.draw(st.sets(st.sampled_from(OTHER_LISTS[url_name]), min_size=1))
    query = {name: data.draw(FORM_TEXT) for name in names}
    answered(superuser.get(reverse(url_name), query))
