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

import hashlib
import logging
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Any, NamedTuple

from django.core import checks
from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured, ValidationError
from django.db import models, transaction
from django.db.models.signals import (
    ModelSignal,
    class_prepared,
    post_delete,
    post_save,
    pre_save,
)
from django.utils import timezone

from delayjobs.api import (
    KEY_MAX_LENGTH,
    OBJECT_ID_MAX_LENGTH,
    _check_max_attempts,
    _check_max_lateness,
    _check_priority,
    _check_queue,
    cancel,
    normalize_payload,
    schedule,
)
from delayjobs.db import attname
from delayjobs.exceptions import DuplicateJob, InvalidJob, UnknownJobType
from delayjobs.jobtypes import NAME_PATTERN, JobType, registry
from delayjobs.models import DelayedJob, DelayedJobQuerySet, JobStatus

log = logging.getLogger(__name__)

Offset = timedelta | Callable[[Any], timedelta]
#: Where pre_save leaves, for post_save, what it read and judged: ``{depth: {binding label:
#: _Pending}}``, one entry per save of the instance under way (see ``_save_depth``).
BEFORE_ATTR = "_delayjobs_bindings_before"


class State(NamedTuple):
    """What a bound job depends on, read from one instance."""

    value: datetime | None
    offset: timedelta | None
    wanted: bool

    @property
    def run_at(self) -> datetime | None:
        """When the job is due; ``None``: no job wanted."""
        if not self.wanted or self.value is None or self.offset is None:
            return None
        return self.value + self.offset

    def effective(self) -> tuple[datetime, timedelta] | None:
        """What two states must share to need the same job (changes while no job is
        wanted do not matter). Value and offset, not their sum: a meeting moved 5 minutes
        later with a reminder 5 minutes earlier keeps its reminder's time, not its payload."""
        if self.run_at is None:
            return None
        assert self.value is not None and self.offset is not None
        return self.value, self.offset


class _Pending(NamedTuple):
    """What pre_save found for one binding, for post_save to act on."""

    #: The state of the row before the save; ``None``: no row (an insert), or unreadable.
    before: State | None
    #: What the save writes, as an instance: the instance itself for a full save, else the
    #: row read before overlaid with the saved fields.
    after: models.Model


class Binding:
    """One job per instance of ``model``, due at ``field + offset`` while ``when`` holds.

    Made by ``delayjobs.bind()``; see the module's docstring for the rules.
    """

    def __init__(
        self,
        model: type[models.Model],
        field: models.DateTimeField[Any, Any],
        job_type: str | type[JobType],
        offset: Offset,
        when: Callable[[Any], bool] | None,
        payload: Callable[[Any], Any] | None,
        options: dict[str, Any],
        depends_on: frozenset[str] | None = None,
    ) -> None:
        self.model = model
        self.field = field
        self.job_type = job_type
        self.job_type_name: str = job_type if isinstance(job_type, str) else job_type.name
        self.offset = offset
        self.when = when
        self.payload = payload
        #: schedule() keyword arguments: queue, max_attempts, max_lateness, priority.
        self.options = options
        #: Names of the fields the job depends on (the bound field included); ``None``:
        #: every concrete field, since ``offset`` and ``when`` may read any of them.
        self.depends_on = depends_on
        # Both spellings: ``update_fields`` may name a foreign key "room" or "room_id".
        self._depends_on_names: frozenset[str] | None = (
            None
            if depends_on is None
            else frozenset(
                name
                for field_name in depends_on
                for name in (field_name, attname(model, field_name))
            )
        )
        self.label = f"{model._meta.label_lower}.{field.name}->{self.job_type_name}"
        self._key_prefix = f"{self.job_type_name}:{model._meta.label_lower}"

    def __repr__(self) -> str:
        return f"<Binding {self.label}>"

    # Public helpers -------------------------------------------------------------------

    def key_for(self, instance: models.Model) -> str:
        """The job key of ``instance``: ``<job type>:<app label>.<model name>:<pk>``.

        Hashed (keeping a readable head) when it would not fit the key column."""
        if instance.pk is None:
            raise ValueError(f"{self}: {instance!r} is not saved, so it has no job key yet.")
        key = f"{self._key_prefix}:{instance.pk}"
        if len(key) <= KEY_MAX_LENGTH and "\x00" not in key:
            return key
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
        head = key[: KEY_MAX_LENGTH - len(digest) - 1].replace("\x00", "")
        return f"{head}#{digest}"

    def jobs_for(self, instance: models.Model) -> DelayedJobQuerySet:
        """Every job this binding scheduled for ``instance``, newest first."""
        return DelayedJob.objects.filter(key=self.key_for(instance)).order_by("-pk")

    def job_for(self, instance: models.Model) -> DelayedJob | None:
        """The job holding ``instance``'s key (scheduled or running), else its latest one."""
        jobs = self.jobs_for(instance)
        return jobs.active().first() or jobs.first()

    def run_at_for(self, instance: models.Model) -> datetime | None:
        """When ``instance``'s job should be due now; ``None`` if it should have none."""
        return self.state(instance).run_at

    def state(self, instance: models.Model, value: Any = models.NOT_PROVIDED) -> State:
        """The field's value (or ``value``), the offset and ``when`` for ``instance``.

        The value is read as Django would write it (see ``_value_of``)."""
        if value is models.NOT_PROVIDED:
            value = getattr(instance, self.field.attname)
        value = self._value_of(value, instance)
        offset = self.offset(instance) if callable(self.offset) else self.offset
        if not isinstance(offset, timedelta):
            raise TypeError(
                f"{self}: offset({instance!r}) must return a datetime.timedelta, got "
                f"{type(offset).__name__} {offset!r}."
            )
        wanted = True if self.when is None else bool(self.when(instance))
        return State(value, offset, wanted)

    def _value_of(self, value: Any, instance: models.Model | None = None) -> datetime | None:
        """``value`` as the field's column holds it once saved: an aware datetime or None.

        Django accepts more on save than a datetime (an ISO string, a date, a naive
        datetime), and a job must be due at the time the row says. A naive value is taken
        in the default time zone, as Django does when it writes it (Django warns then; not
        here, or every save would warn twice). ``InvalidJob`` if it is not a time at all.
        """
        try:
            value = self.field.to_python(value)
        except ValidationError as exc:
            raise InvalidJob(
                f"{self}: {self.field.name} of {instance!r} must be a date and time, got "
                f"{type(value).__name__} {value!r} ({'; '.join(exc.messages)})."
            ) from None
        if value is None:
            return None
        if timezone.is_naive(value):
            # With USE_TZ = False too: the column's naive times are in the default zone.
            value = timezone.make_aware(value, timezone.get_default_timezone())
        try:
            # In UTC, as read back from the database: an offset added to a zone's time
            # would be added to its wall clock, wrong across a daylight saving change, and
            # times in one zone compare as wall-clock times (the two passes of an hour
            # repeated in autumn would be equal).
            return value.astimezone(UTC)
        except OverflowError:
            raise InvalidJob(
                f"{self}: {self.field.name} of {instance!r} ({value}) is out of the range of "
                f"dates in UTC."
            ) from None

    def sync(self, objects: Iterable[models.Model]) -> int:
        """Derive the jobs of ``objects`` (a queryset or instances) from their current state.

        For rows changed without model signals (``QuerySet.update()``, ``bulk_create()``,
        raw SQL), and once after adding a binding to a model that already has rows. Each
        object is treated as changed: its job is cancelled if it should have none,
        otherwise moved, or scheduled if none is active; an active job already due at the
        right time with the right payload is left as it is. Beware: an object whose job
        already ran gets a new one. Returns how many jobs were scheduled, moved or cancelled.
        """
        changed = 0
        instances = objects.iterator() if isinstance(objects, models.QuerySet) else objects
        for instance in instances:
            state = self._checked_state(instance)
            changed += self._apply(instance, state, unless_current=True)
        return changed

    def unbind(self) -> None:
        """Stop keeping jobs in step (for tests). Jobs already scheduled stay as they are."""
        _BINDINGS.pop(_identity(self.model, self.job_type_name), None)
        _BINDINGS_BY_CLASS.clear()

    def resolve_job_type(self) -> JobType:
        """The registered job type, or ImproperlyConfigured saying what is missing."""
        try:
            return registry.resolve(self.job_type)
        except UnknownJobType as exc:
            raise ImproperlyConfigured(
                f"{self}: job type {self.job_type_name!r} is not registered. {exc}"
            ) from None

    # The rules --------------------------------------------------------------------------

    def concerned_by(self, update_fields: frozenset[str] | None) -> bool:
        """Whether a save writing ``update_fields`` (``None``: every field) may change the
        job: only a save that writes none of the fields it depends on surely cannot."""
        if update_fields is None or self._depends_on_names is None:
            return True
        return not self._depends_on_names.isdisjoint(update_fields)

    def _checked_state(self, instance: models.Model, value: Any = models.NOT_PROVIDED) -> State:
        """``state(instance, value)``, checked for being able to give a job: raised before
        the row is written, these errors leave nothing half done."""
        state = self.state(instance, value)
        try:
            run_at = state.run_at
        except OverflowError:
            raise InvalidJob(
                f"{self}: {self.field.name} of {instance!r} ({state.value}) plus the offset "
                f"({state.offset}) is out of the range of dates."
            ) from None
        if run_at is not None:
            self.resolve_job_type()
        return state

    def _saved(self, after: models.Model, created: bool, before: State | None) -> None:
        """Act on a save: ``after`` is the row as written, ``before`` as it was."""
        state = self.state(after)
        if created or before is None or state.effective() != before.effective():
            # Without a before (an existing row whose state could not be judged), the job
            # may well be right already: then it is left alone, attempts and all.
            self._apply(after, state, unless_current=not created)

    def _apply(self, instance: models.Model, state: State, *, unless_current: bool) -> int:
        """Cancel, move or schedule ``instance``'s job to match ``state``; 1 if it changed."""
        key = self.key_for(instance)
        run_at = state.run_at
        if run_at is None:
            return cancel(key=key)
        payload = self._payload(instance)
        if unless_current and self._is_current(key, run_at, payload):
            return 0
        self.resolve_job_type()
        try:
            schedule(
                self.job_type,
                payload,
                run_at=run_at,
                key=key,
                replace=True,
                obj=instance if len(str(instance.pk)) <= OBJECT_ID_MAX_LENGTH else None,
                **self.options,
            )
        except DuplicateJob as exc:
            # Running right now: it cannot be moved, and must check the object itself.
            log.warning(
                "%s: job %s for %r is running and cannot be moved to %s; the running job "
                "sees the object as it is now, and no job is scheduled for the new time.",
                self,
                exc.existing_id,
                instance,
                run_at.isoformat(),
            )
            return 0
        except InvalidJob as exc:
            exc.args = (f"{self}, for {instance!r}: {exc}",)
            raise
        return 1

    def _is_current(self, key: str, run_at: datetime, payload: Any) -> bool:
        job = DelayedJob.objects.active().filter(key=key).first()
        return (
            job is not None
            and job.status == JobStatus.SCHEDULED
            and job.run_at == run_at
            and job.payload == normalize_payload(payload)
        )

    def _payload(self, instance: models.Model) -> Any:
        if self.payload is not None:
            return self.payload(instance)
        pk = instance.pk
        # An int or a str is JSON as it is; a UUID (or anything else) goes as its text.
        return {"pk": pk if isinstance(pk, int | str) else str(pk)}

    def _signature(self) -> tuple[Any, ...]:
        """What makes two declarations the same one. Equality, so the same functions (or
        methods of the same class), not lookalikes: two lambdas are two declarations."""
        return (
            self.field,
            self.job_type,
            self.offset,
            self.when,
            self.payload,
            self.options,
            self.depends_on,
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
    identity = _identity(model, job_type_name)
    existing = _BINDINGS.get(identity)
    if existing is not None:
        if existing._signature() == binding._signature():
            return existing  # the very same declaration again
        raise ImproperlyConfigured(
            f"{meta.label} is already bound to job type {job_type_name!r} (on "
            f"{existing.field.name!r}, as {existing!r}); one binding per model and job type, "
            f"since the job's key is made of both (unbind() the first to replace it)."
        )
    _BINDINGS[identity] = binding
    _BINDINGS_BY_CLASS.clear()
    _connect(model)
    return binding


# Declarations ---------------------------------------------------------------------------

_BINDINGS: dict[tuple[str, str], Binding] = {}
#: Bindings that apply to instances of a class (its own and its concrete ancestors').
_BINDINGS_BY_CLASS: dict[type, tuple[Binding, ...]] = {}


def _identity(model: type[models.Model], job_type: str) -> tuple[str, str]:
    return (model._meta.label_lower, job_type)


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
    if isinstance(job_type, str) and NAME_PATTERN.fullmatch(job_type):
        return job_type
    raise TypeError(
        f"bind(): job_type must be a JobType subclass or the name of one (1-200 letters, "
        f"digits and '_.:-'), got {job_type!r}."
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
        "queue": _check_queue,
        "max_attempts": _check_max_attempts,
        "max_lateness": _check_max_lateness,
        "priority": _check_priority,
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


def bindings_for(cls: type) -> tuple[Binding, ...]:
    """The bindings that apply to instances of ``cls`` (a bound model, or a subclass)."""
    try:
        return _BINDINGS_BY_CLASS[cls]
    except KeyError:
        pass
    found = tuple(b for b in _BINDINGS.values() if issubclass(cls, b.model))
    _BINDINGS_BY_CLASS[cls] = found
    return found


# Signals ----------------------------------------------------------------------------------


def _connect(model: type[models.Model]) -> None:
    """Connect the receivers for ``model`` and its subclasses (proxies, child models).

    Per sender rather than for every sender: saves and deletes of other models need not
    even look bindings up. The dispatch_uid makes connecting twice (several bindings on
    one model) a no-op.
    """
    for cls in [model, *_subclasses(model)]:
        for signal, receiver in SIGNALS:
            uid = f"delayjobs.bindings.{receiver.__name__}"
            signal.connect(receiver, sender=cls, dispatch_uid=uid)


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def _on_class_prepared(sender: type[models.Model], **kwargs: Any) -> None:
    # A proxy or child of a bound model declared after the binding: it needs receivers too.
    if any(issubclass(sender, binding.model) for binding in _BINDINGS.values()):
        _BINDINGS_BY_CLASS.clear()
        _connect(sender)


class_prepared.connect(_on_class_prepared, dispatch_uid="delayjobs.bindings_on_class_prepared")


def _on_pre_save(
    sender: type[models.Model],
    instance: models.Model,
    raw: bool,
    using: str,
    update_fields: frozenset[str] | None,
    **kwargs: Any,
) -> None:
    depth = _save_depth()
    pending: dict[int, dict[str, _Pending]] | None = instance.__dict__.get(BEFORE_ATTR)
    if pending:
        # Left by saves that failed between their pre_save and post_save: never to be
        # taken for this one's. (Entries less deep may be saves this one runs inside.)
        _forget(instance, pending, lambda entry: entry >= depth)
    if raw:
        return
    bindings = [b for b in bindings_for(type(instance)) if b.concerned_by(update_fields)]
    if not bindings:
        return  # update_fields writes nothing any binding depends on: no query
    previous = None if _is_new(instance) else _read_row(instance, bindings, using)
    adding = previous is None
    befores: list[State | None] = []
    for binding in bindings:
        before = None
        if previous is not None:
            try:
                before = binding.state(previous)
            except Exception:
                # A row that offset/when cannot judge (written by other code, or before a
                # change of the callables): compare with its job instead (post_save).
                log.debug("%s: cannot judge the row before the save", binding, exc_info=True)
        befores.append(before)
    # Only now: the overlay below changes ``previous``, whose states are taken above.
    after = instance
    if update_fields is not None and previous is not None:
        # Only the saved fields reach the row: judge the row as it will be, not the
        # instance, whose other fields may hold changes that are not saved.
        after = _overlay(previous, instance, update_fields)
    judged = {}
    for binding, before in zip(bindings, befores, strict=True):
        value: Any = models.NOT_PROVIDED
        field = binding.field
        if field.auto_now or (field.auto_now_add and adding):
            # Django sets the field during the save, after this signal: judge the time it
            # will get, not the instance's older (or empty) value.
            value = timezone.now()
        # Fails the save before the row is written: no row without its job.
        binding._checked_state(after, value)
        judged[binding.label] = _Pending(before, after)
    instance.__dict__.setdefault(BEFORE_ATTR, {})[depth] = judged


def _read_row(instance: models.Model, bindings: list[Binding], using: str) -> models.Model | None:
    """The row ``instance`` is about to overwrite, as the database holds it; ``None`` if
    there is none (the save will insert it)."""
    rows = type(instance)._base_manager.db_manager(using).filter(pk=instance.pk)
    if all(b.depends_on is not None for b in bindings):
        rows = rows.only(*{name for b in bindings for name in b.depends_on or ()})
    if transaction.get_connection(using).in_atomic_block:
        # The save's UPDATE would lock the row a moment later anyway: locking it now keeps
        # a concurrent save from changing it between this read and that write (which
        # would leave its job where this save does not expect it). Ignored by SQLite,
        # whose transactions already write one at a time.
        rows = rows.select_for_update()
    return rows.first()


def _overlay(
    row: models.Model, instance: models.Model, update_fields: frozenset[str]
) -> models.Model:
    """``row`` with the fields in ``update_fields`` taken from ``instance``."""
    for field in instance._meta.concrete_fields:
        if field.name in update_fields or field.attname in update_fields:
            # By attname, so that a changed foreign key forgets its cached object.
            setattr(row, field.attname, getattr(instance, field.attname))
    return row


def _on_post_save(
    sender: type[models.Model],
    instance: models.Model,
    created: bool,
    raw: bool,
    using: str,
    update_fields: frozenset[str] | None,
    **kwargs: Any,
) -> None:
    pending: dict[int, dict[str, _Pending]] | None = instance.__dict__.get(BEFORE_ATTR)
    if not pending:
        return  # no binding concerned, or raw (loaddata: jobs are not in fixtures)
    depth = _save_depth()
    judged = pending.get(depth)
    # This save's entry, and any deeper ones: saves inside this one that failed.
    _forget(instance, pending, lambda entry: entry >= depth)
    if raw or judged is None:
        return
    for binding in bindings_for(type(instance)):
        found = judged.get(binding.label)
        if found is None:
            continue  # the save wrote nothing this binding depends on
        after = found.after
        if after is not instance:
            # Again: fields set during the save (auto_now) are in the instance only now.
            assert update_fields is not None
            _overlay(after, instance, update_fields)
        binding._saved(after, created, found.before)


def _save_depth() -> int:
    """Which save of an instance a signal is about, for a receiver calling this directly:
    its depth in the call stack.

    One attribute of the instance cannot hold what pre_save found until post_save: the
    instance may be saved again in between, by a receiver of the same signals (a post_save
    receiver connected before these giving a new row its number), and that inner save's
    pre_save and post_save run first. Both signals of one save are sent by the same call
    (``Model.save_base``), so their receivers run at the same depth, and a save inside it
    runs deeper. A save that raised between the two never sends post_save, and leaves its
    entry behind: every pre_save drops the entries as deep as itself or deeper (none of
    them can be of a save still under way around it), so a post_save only ever finds the
    entry its own pre_save left."""
    depth = 0
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        depth += 1
        frame = frame.f_back
    return depth


def _forget(
    instance: models.Model, pending: dict[int, dict[str, _Pending]], drop: Callable[[int], bool]
) -> None:
    for entry in [entry for entry in pending if drop(entry)]:
        del pending[entry]
    if not pending:
        instance.__dict__.pop(BEFORE_ATTR, None)


def _on_post_delete(sender: type[models.Model], instance: models.Model, **kwargs: Any) -> None:
    for binding in bindings_for(type(instance)):
        if instance.pk is not None:
            cancel(key=binding.key_for(instance))


def _is_new(instance: models.Model) -> bool:
    """Whether this save inserts a row nobody saw before (so there is nothing to read)."""
    return instance._state.adding and (instance.pk is None or instance._meta.pk.has_default())


SIGNALS: tuple[tuple[ModelSignal, Callable[..., None]], ...] = (
    (pre_save, _on_pre_save),
    (post_save, _on_post_save),
    (post_delete, _on_post_delete),
)


# System check ------------------------------------------------------------------------------


@checks.register("delayjobs")
def check_bindings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for binding in _BINDINGS.values():
        try:
            binding.resolve_job_type()
        except ImproperlyConfigured as exc:
            errors.append(
                checks.Error(
                    str(exc),
                    hint="Register the job type with @delayjobs.register in a delay_jobs "
                    "module of an installed app, or fix the name given to bind().",
                    obj=binding.model,
                    id="delayjobs.E100",
                )
            )
    return errors
