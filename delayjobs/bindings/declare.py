"""Jobs bound to model fields: ``delayjobs.bind(Meeting, "starts_at", job_type=...)``.

A binding keeps one job per object in step with the object: creating it schedules the job
at ``getattr(instance, field) + offset``, changing the field (or the offset) moves the job,
deleting the object or ``when`` turning false cancels it. The job's key is derived from the
object, so at most one such job per object is ever active.

How a save is judged. A save only touches the job when something the job depends on
changed: the field's value, the offset's value, or ``when``. What it is compared with is
the row as the database holds it just before the save, read by primary key in
``pre_save`` (under a row lock inside a transaction, so that a concurrent save cannot slip
between the read and the write). Not with what the instance remembers: an instance may be
stale (loaded before another request moved the meeting) and its save then writes its old
time back, which must move the job back too. So a change is acted upon once, whoever made
it, and a save that leaves the row's time, offset and ``when`` as they were (a new title)
never schedules a job that already ran a second time.

What the save will write is judged as the row will be after it: the instance itself for a
full save, the row read before overlaid with only the saved fields for
``save(update_fields=...)`` (an unsaved change in memory does not count). ``offset`` and
``when`` are arbitrary callables, so by default every column counts: every save of a bound
model costs that one indexed read. ``bind(..., depends_on=[...])`` names the fields they
read; a ``save(update_fields=...)`` that writes none of those (nor the bound field) is then
known not to concern the job, and costs no query.

Values are checked before the row is written: the field's value is read as Django writes it
(``to_python()``: an ISO string is parsed; a naive datetime is taken in the default time
zone, as Django does, with its warning), and a value, offset or job type that cannot give a
job fails the save with ``InvalidJob`` (or ``TypeError``, ``ImproperlyConfigured``) naming
the binding, before anything is written.

Times are instants: the value is taken in UTC before the offset is added, as it comes back
from the database. Fifteen minutes before 03:10 on the night clocks go forward is fifteen
minutes before on any clock, not 02:55 local time (which does not exist there); and the
two passes of 02:30 on the night they go back are two different times.

What a change does:

- ``when`` false, or the field ``None``: the active job is cancelled (a running job is not
  interrupted: its job type's ``should_run``/``execute`` see the object's new state).
- Otherwise ``schedule(..., key=..., replace=True)``: the scheduled job moves to the new
  time (and payload); if the job already ended (ran, was cancelled), a new one is
  scheduled for the new time, even a past time, when it then runs at once. A meeting moved
  after its reminder was sent gets a reminder for its new time; a job type that must not
  run late says so with ``should_run`` or ``max_lateness``.
- A job that is running cannot be moved (``DuplicateJob``): that is logged, the save goes
  on, and the running job must see for itself that its object changed. The new time gets
  no job from the binding (a job type's ``plan()`` can catch it; see the sample project).

Jobs are written to ``jobs_database()``: they commit or roll back with the object's row
only when that is the database the object is saved to.

``QuerySet.update()``, ``bulk_create()`` and ``bulk_update()`` send no model signals: after
them, call ``Binding.sync(objects)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured
from django.db import models

from delayjobs.bindings.binding import Binding, Offset, declare, declared
from delayjobs.bindings.receivers import connect
from delayjobs.exceptions import InvalidJob
from delayjobs.jobtypes import JobType
from delayjobs.names import NAME_RULE, is_name
from delayjobs.validation import (
    check_max_attempts,
    check_max_lateness,
    check_priority,
    check_queue,
)


def bind(
    model: type[models.Model],
    field: str,
    *,
    job_type: str | type[JobType],
    offset: Offset = timedelta(0),
    when: Callable[[Any], bool] | None = None,
    payload: Callable[[Any], Any] | None = None,
    depends_on: Iterable[str] | None = None,
    queue: str | None = None,
    max_attempts: int | None = None,
    max_lateness: timedelta | None = None,
    priority: int = 0,
) -> Binding:
    """Keep one ``job_type`` job per ``model`` instance, due at ``field + offset``.

    ``offset``: a timedelta, or a callable(instance) -> timedelta. ``when``:
    callable(instance) -> bool; the job exists only while it is true. ``payload``:
    callable(instance) -> JSON-serializable value (default ``{"pk": instance.pk}``).
    ``depends_on``: the names of the fields ``offset`` and ``when`` read (the bound field
    is always included); a ``save(update_fields=...)`` that writes none of them is then
    skipped without a query. Default: every field. ``queue``, ``max_attempts``,
    ``max_lateness`` and ``priority`` are passed to ``schedule()`` (default: the job
    type's).

    ``offset`` and ``when`` run at each save of an instance (on the instance about to be
    saved, which has no pk yet if it is new, and on the row before and after the save),
    never when instances are loaded: keep them cheap, reading the row's own fields.

    Declare bindings once, where job types are declared (an app's ``delay_jobs.py``) or in
    ``AppConfig.ready()``. The job type may be registered later; it is looked up when the
    first job is scheduled, and by a system check (``delayjobs.E100``).
    """
    if not (
        isinstance(model, type) and issubclass(model, models.Model) and model is not models.Model
    ):
        raise TypeError(f"bind() expects a model class, got {model!r}.")
    meta = model._meta
    if meta.abstract or meta.proxy or meta.swapped:
        kind = "abstract" if meta.abstract else "a proxy" if meta.proxy else "swapped out"
        raise ImproperlyConfigured(
            f"bind({model.__name__}, ...): the model is {kind}; bind a concrete model "
            f"(its subclasses and proxies are covered by it)."
        )
    bound_field = _datetime_field(model, field)
    job_type_name = _job_type_name(job_type)
    label = f"{meta.label}.{bound_field.name}"
    if not (isinstance(offset, timedelta) or callable(offset)):
        raise TypeError(
            f"bind({label}): offset must be a timedelta or a callable(instance) -> timedelta, "
            f"got {type(offset).__name__} {offset!r}."
        )
    for name, value in (("when", when), ("payload", payload)):
        if value is not None and not callable(value):
            raise TypeError(
                f"bind({label}): {name} must be a callable taking the instance, got {value!r}."
            )
    depends = _depends_on(model, label, bound_field, depends_on)
    options = _checked_options(
        label, queue=queue, max_attempts=max_attempts, max_lateness=max_lateness, priority=priority
    )
    binding = Binding(model, bound_field, job_type, offset, when, payload, options, depends)
    existing = declared(model, job_type_name)
    if existing is not None:
        if existing._signature() == binding._signature():
            return existing  # the very same declaration again
        raise ImproperlyConfigured(
            f"{meta.label} is already bound to job type {job_type_name!r} (on "
            f"{existing.field.name!r}, as {existing!r}); one binding per model and job type, "
            f"since the job's key is made of both (unbind() the first to replace it)."
        )
    declare(binding)
    connect(model)
    return binding


# Checks of the declaration -------------------------------------------------------------


def _datetime_field(model: type[models.Model], name: Any) -> models.DateTimeField[Any, Any]:
    datetime_fields = [
        f.name for f in model._meta.concrete_fields if isinstance(f, models.DateTimeField)
    ]
    hint = f" Its DateTimeFields: {', '.join(datetime_fields) or 'none'}."
    if not isinstance(name, str):
        raise TypeError(f"bind({model._meta.label}, ...): field must be a name, got {name!r}.")
    try:
        field = model._meta.get_field(name)
    except FieldDoesNotExist:
        raise ImproperlyConfigured(
            f"bind({model._meta.label}, {name!r}): the model has no field {name!r}.{hint}"
        ) from None
    # A DateField is refused: a date alone has no time of day nor time zone to be due at.
    if not isinstance(field, models.DateTimeField) or not field.concrete:
        raise ImproperlyConfigured(
            f"bind({model._meta.label}, {name!r}): the field must be a DateTimeField, it is "
            f"a {type(field).__name__}.{hint}"
        )
    return field


def _job_type_name(job_type: Any) -> str:
    if isinstance(job_type, type) and issubclass(job_type, JobType):
        return job_type.name
    if is_name(job_type):
        return str(job_type)
    raise TypeError(
        f"bind(): job_type must be a JobType subclass or the name of one ({NAME_RULE}), "
        f"got {job_type!r}."
    )


def _depends_on(
    model: type[models.Model],
    label: str,
    bound_field: models.DateTimeField[Any, Any],
    names: Iterable[str] | None,
) -> frozenset[str] | None:
    """The field names ``depends_on`` declares, checked, with the bound field's."""
    if names is None:
        return None
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise TypeError(f"bind({label}): depends_on must be a list of field names, got {names!r}.")
    fields = {bound_field.name}
    for name in names:
        try:
            field = model._meta.get_field(name) if isinstance(name, str) else None
        except FieldDoesNotExist:
            field = None
        if field is None or not field.concrete:
            raise ImproperlyConfigured(
                f"bind({label}): depends_on names {name!r}, which is not a field stored in "
                f"{model._meta.label}'s rows."
            )
        fields.add(field.name)
    return frozenset(fields)


def _checked_options(label: str, **options: Any) -> dict[str, Any]:
    """The schedule() options given, checked now rather than at the first save."""
    checkers: dict[str, Callable[[Any], Any]] = {
        "queue": check_queue,
        "max_attempts": check_max_attempts,
        "max_lateness": check_max_lateness,
        "priority": check_priority,
    }
    checked = {}
    for name, value in options.items():
        if value is None or (name == "priority" and value == 0):
            continue  # the job type's default (or schedule's) applies
        try:
            checked[name] = checkers[name](value)
        except InvalidJob as exc:
            raise ImproperlyConfigured(f"bind({label}): {exc}") from None
    return checked
