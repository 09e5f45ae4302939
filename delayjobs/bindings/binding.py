"""A binding (``Binding``): one job per instance of a model, kept in step with a field;
and the declared bindings, by model and job type.

``bind()`` (``delayjobs.bindings.declare``) makes them, and its module's docstring says
the rules; the model signals' receivers (``delayjobs.bindings.receivers``) act on them.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import models
from django.utils import timezone

from delayjobs.api.verbs import cancel, schedule
from delayjobs.core.db import attname
from delayjobs.exceptions import DuplicateJob, InvalidJob, UnknownJobType
from delayjobs.jobtypes import JobType, registry
from delayjobs.models import DelayedJob, DelayedJobQuerySet, JobStatus
from delayjobs.payload import normalize_payload
from delayjobs.validation import KEY_MAX_LENGTH, OBJECT_ID_MAX_LENGTH

log = logging.getLogger("delayjobs.bindings")  # the old path: users' LOGGING names it

Offset = timedelta | Callable[[Any], timedelta]


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


class Binding:
    """One job per instance of ``model``, due at ``field + offset`` while ``when`` holds.

    Made by ``delayjobs.bind()``; the rules are in the docstring of the module
    ``delayjobs.bindings.declare``.
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
        _BINDINGS.pop(identity(self.model, self.job_type_name), None)
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


# Declarations ---------------------------------------------------------------------------

_BINDINGS: dict[tuple[str, str], Binding] = {}
#: Bindings that apply to instances of a class (its own and its concrete ancestors').
_BINDINGS_BY_CLASS: dict[type, tuple[Binding, ...]] = {}


def identity(model: type[models.Model], job_type: str) -> tuple[str, str]:
    """What there is one binding of at most: a model and a job type (the job's key is
    made of both)."""
    return (model._meta.label_lower, job_type)


def declared(model: type[models.Model], job_type: str) -> Binding | None:
    """The binding of ``model`` to the job type named ``job_type``, if there is one."""
    return _BINDINGS.get(identity(model, job_type))


def declare(binding: Binding) -> None:
    """Keep ``binding``: its model's saves and deletes now act on its jobs."""
    _BINDINGS[identity(binding.model, binding.job_type_name)] = binding
    _BINDINGS_BY_CLASS.clear()


def every_binding() -> list[Binding]:
    """Every binding declared."""
    return list(_BINDINGS.values())


def forget_classes() -> None:
    """Drop the bindings found per class: a class declared since may change them."""
    _BINDINGS_BY_CLASS.clear()


def bindings_for(cls: type) -> tuple[Binding, ...]:
    """The bindings that apply to instances of ``cls`` (a bound model, or a subclass)."""
    try:
        return _BINDINGS_BY_CLASS[cls]
    except KeyError:
        pass
    found = tuple(b for b in _BINDINGS.values() if issubclass(cls, b.model))
    _BINDINGS_BY_CLASS[cls] = found
    return found
