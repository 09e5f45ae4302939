"""The admin of API keys: list them, create one (its key is shown once), revoke them.

A key is revoked by unticking "active" (in the list or on its page), not deleted, so that its
name and last use stay on record. The digest is never shown.

A key acts with all of its user's permissions, so who may touch which key is narrower
than the model permissions alone: a superuser sees and changes every key; anyone else
(with the apikey permissions) only their own. Revocation is one way: a revoked key's
"active" cannot be ticked again, by anyone (create a new key instead).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import QuerySet
from django.forms.fields import InvalidJSONInput
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from delayjobs.admin.lookups import RefusesNulInLists
from delayjobs.api_keys import check_job_types, create_api_key
from delayjobs.models import ApiKey

SHOWN_FIELDS = (
    "name",
    "user",
    "prefix",
    "is_active",
    "job_types",
    "created_at",
    "last_used_at",
)


class JobTypesField(forms.JSONField):
    """Django's JSON form field, but text that ``json`` refuses with something other than
    a JSONDecodeError (an integer of 5000 digits: ValueError; 10,000 nested brackets:
    RecursionError) is a form error too, not a server error, on submit and on the page
    shown again with it."""

    default_error_messages = {"invalid": _("Enter a JSON list of job type names.")}

    def to_python(self, value: Any) -> Any:
        try:
            return super().to_python(value)
        except (ValueError, RecursionError):
            raise ValidationError(self.error_messages["invalid"], code="invalid") from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            return super().bound_data(data, initial)
        except (ValueError, RecursionError):
            return InvalidJSONInput(data)


def clean_key_job_types(form: forms.ModelForm[ApiKey], editor: Any) -> list[str]:
    """The key's private job types, if ``editor`` may set them: a superuser only, since a
    key with a list may schedule job types no other key can."""
    names = form.cleaned_data.get("job_types") or []
    if names == (form.instance.job_types or []):
        return names
    if not editor.is_superuser:
        raise ValidationError(_("Only a superuser may let a key schedule private job types."))
    try:
        return check_job_types(names if isinstance(names, list) else [names])
    except ValueError as exc:
        raise ValidationError(str(exc)) from None


class ApiKeyAddForm(forms.ModelForm):
    """A new key's user and name. A key acts with all of its user's permissions, so only a
    superuser may create one for someone else: add_apikey alone must not be a way to act
    as a more powerful user."""

    #: Who fills in the form (set by ApiKeyAdmin.get_form).
    creator: Any = None

    class Meta:
        model = ApiKey
        fields = ("user", "name", "job_types")

    def clean_job_types(self) -> list[str]:
        return clean_key_job_types(self, self.creator)

    def clean_user(self) -> Any:
        user = self.cleaned_data["user"]
        if not self.creator.is_superuser and user != self.creator:
            raise ValidationError(
                _("Only a superuser may create a key for another user; choose yourself.")
            )
        return user


class OneWayRevocationForm(forms.ModelForm):
    """A key's form (on its page and in the list) that cannot re-activate a revoked key:
    once a key is revoked, its "active" box is disabled, so a posted value is ignored."""

    #: Who edits the key (set by ApiKeyAdmin.get_form).
    editor: Any = None

    def clean_job_types(self) -> list[str]:
        return clean_key_job_types(self, self.editor)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields.get("is_active")
        if field is not None and self.instance.pk is not None and not self.instance.is_active:
            field.disabled = True


def may_manage(user: Any, key: ApiKey | None) -> bool:
    """Whether ``user`` may see and change ``key`` (None: keys in general)."""
    return key is None or user.is_superuser or key.user_id == user.pk


@admin.register(ApiKey)
class ApiKeyAdmin(RefusesNulInLists, admin.ModelAdmin):
    list_display = SHOWN_FIELDS
    list_filter = ("is_active",)
    search_fields = ("name", "prefix", "user__username")
    list_select_related = ("user",)
    # A plain id field: autocomplete would need the project's user admin to be searchable.
    raw_id_fields = ("user",)
    # Revoking is unticking "active", here in the list or on the key's page. No actions:
    # every action of delayjobs' admin needs a dedicated permission (see
    # tests/integration/test_access.py).
    list_editable = ("is_active",)
    actions = None
    formfield_overrides = {models.JSONField: {"form_class": JobTypesField}}

    def get_queryset(self, request: HttpRequest) -> QuerySet[ApiKey]:
        keys = super().get_queryset(request)
        if request.user.is_superuser:
            return keys
        # Another user's key is not even listed: its name and use are that user's business.
        return keys.filter(user=request.user)

    def has_view_permission(self, request: HttpRequest, obj: ApiKey | None = None) -> bool:
        return super().has_view_permission(request, obj) and may_manage(request.user, obj)

    def has_change_permission(self, request: HttpRequest, obj: ApiKey | None = None) -> bool:
        return super().has_change_permission(request, obj) and may_manage(request.user, obj)

    def has_delete_permission(self, request: HttpRequest, obj: ApiKey | None = None) -> bool:
        return super().has_delete_permission(request, obj) and may_manage(request.user, obj)

    def get_form(
        self, request: HttpRequest, obj: ApiKey | None = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            kwargs["form"] = type("ApiKeyAddForm", (ApiKeyAddForm,), {"creator": request.user})
        else:
            kwargs["form"] = type(
                "OneWayRevocationForm", (OneWayRevocationForm,), {"editor": request.user}
            )
        return super().get_form(request, obj, change, **kwargs)

    def get_changelist_form(self, request: HttpRequest, **kwargs: Any) -> Any:
        kwargs.setdefault("form", OneWayRevocationForm)
        return super().get_changelist_form(request, **kwargs)

    def get_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> tuple[str, ...]:
        # A new key needs a user and a name; prefix and digest are drawn when it is saved.
        return ("user", "name", "job_types") if obj is None else SHOWN_FIELDS

    def get_readonly_fields(
        self, request: HttpRequest, obj: ApiKey | None = None
    ) -> tuple[str, ...]:
        if obj is None:
            return ()
        fixed: tuple[str, ...] = ("user", "prefix", "created_at", "last_used_at")
        if not request.user.is_superuser:
            fixed += ("job_types",)
        return fixed if obj.is_active else (*fixed, "is_active")

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            # The forms cannot re-activate a key; this holds whatever form posts here.
            if not ApiKey.objects.filter(pk=obj.pk, is_active=True).exists():
                obj.is_active = False
            super().save_model(request, obj, form, change)
            return
        created, plaintext = create_api_key(obj.user, obj.name, obj.job_types)
        # The admin's log entry and response need the row create_api_key wrote.
        obj.pk, obj.prefix, obj.digest = created.pk, created.prefix, created.digest
        obj.created_at = created.created_at
        # Kept on the request only, never in the session or a message cookie.
        request._delayjobs_api_key = plaintext  # type: ignore[attr-defined]

    def response_add(
        self, request: HttpRequest, obj: ApiKey, post_url_continue: str | None = None
    ) -> HttpResponse:
        """A page that shows the new key once, instead of the usual redirect."""
        plaintext = getattr(request, "_delayjobs_api_key", None)
        if plaintext is None:  # pragma: no cover - save_model always sets it
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("API key created"),
            "opts": self.opts,
            "api_key": obj,
            "plaintext": plaintext,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/delayjobs/apikey/created.html", context)
