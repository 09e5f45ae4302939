"""Jobs bound to model fields: ``delayjobs.bind(Meeting, "starts_at", job_type=...)``.

A binding keeps one job per object in step with the object: creating it schedules the job
at ``getattr(instance, field) + offset``, changing the field (or the offset) moves the job,
deleting the object or ``when`` turning false cancels it. The job's key is derived from the
object, so at most one such job per object is ever active.

How a save is judged. A save only touches the job when something the job depends on
changed: the field's value, the offset's value, or ``when``. Each instance carries a
snapshot of these, taken when it was loaded (``post_init``) and after each save; a save
that changes none of them (a new title, say) leaves the job alone, even if the job already
ran and freed its key. When the snapshot cannot be trusted (no snapshot: deferred fields,
an instance built by hand; or an earlier save of it inside a transaction that was not yet
committed, maybe rolled back) or it suggests a change, ``pre_save`` reads the row as the
database holds it before the save, and that is what the new state is compared with. So a
change is acted upon once, whoever made it, and an unchanged row never schedules twice.

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

``QuerySet.update()``, ``bulk_create()`` and ``bulk_update()`` send no model signals: after
them, call ``Binding.sync(objects)``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.core import checks
from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured
from django.db import models, transaction
from django.db.models.signals import (
    ModelSignal,
    class_prepared,
    post_delete,
    post_init,
    post_save,
    pre_save,
)

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
from delayjobs.exceptions import DuplicateJob, InvalidJob, UnknownJobType
from delayjobs.jobtypes import NAME_PATTERN, JobType, registry
from delayjobs.models import DelayedJob, JobStatus

log = logging.getLogger(__name__)

Offset = timedelta | Callable[[Any], timedelta]
#: Where an instance keeps its snapshots, by binding label: plain values only, so that
#: model instances stay picklable (for caches) with bindings declared with lambdas.
SNAPSHOTS_ATTR = "_delayjobs_bindings"
#: Where pre_save leaves, for post_save, the state the database held before the save.
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


@dataclass
class Snapshot:
    state: State
    #: False from a save until its transaction commits (it may still roll back).
    confirmed: bool


class Binding:
    """One job per instance of ``model``, due at ``field + offset`` while ``when`` holds.

    Made by ``delayjobs.bind()``; see the module's docstring for the rules.
    """

    def __init__(
        self,
        model: type[models.Model],
        field: models.DateTimeField,
        job_type: str | type[JobType],
        offset: Offset,
        when: Callable[[Any], bool] | None,
        payload: Callable[[Any], Any] | None,
        options: dict[str, Any],
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

    def jobs_for(self, instance: models.Model) -> models.QuerySet[DelayedJob]:
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
        """The field's value (or ``value``), the offset and ``when`` for ``instance``."""
        if value is models.NOT_PROVIDED:
            value = getattr(instance, self.field.attname)
        offset = self.offset(instance) if callable(self.offset) else self.offset
        if not isinstance(offset, timedelta):
            raise TypeError(
                f"{self}: offset({instance!r}) must return a datetime.timedelta, got "
                f"{type(offset).__name__} {offset!r}."
            )
        wanted = True if self.when is None else bool(self.when(instance))
        return State(value, offset, wanted)

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
            state = self.state(instance)
            changed += self._apply(instance, state, unless_current=True)
            _remember(instance, self, state, instance._state.db)
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

    def _saved(
        self,
        instance: models.Model,
        created: bool,
        before: State | None,
        update_fields: frozenset[str] | None,
        using: str,
    ) -> None:
        if (
            update_fields is not None
            and self.field.name not in update_fields
            and self.field.attname not in update_fields
            and before is not None
        ):
            # The row kept the field's old value, whatever the instance holds in memory.
            state = self.state(instance, value=before.value)
        else:
            state = self.state(instance)
        if created or before is None or state.effective() != before.effective():
            # Without a before (a row saved over by an instance built with its pk), the
            # job may well be right already: then it is left alone, attempts and all.
            self._apply(instance, state, unless_current=not created and before is None)
        _remember(instance, self, state, using)

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
        return (self.field, self.job_type, self.offset, self.when, self.payload, self.options)


def bind(
    model: type[models.Model],
    field: str,
    *,
    job_type: str | type[JobType],
    offset: Offset = timedelta(0),
    when: Callable[[Any], bool] | None = None,
    payload: Callable[[Any], Any] | None = None,
    queue: str | None = None,
    max_attempts: int | None = None,
    max_lateness: timedelta | None = None,
    priority: int = 0,
) -> Binding:
    """Keep one ``job_type`` job per ``model`` instance, due at ``field + offset``.

    ``offset``: a timedelta, or a callable(instance) -> timedelta. ``when``:
    callable(instance) -> bool; the job exists only while it is true. ``payload``:
    callable(instance) -> JSON-serializable value (default ``{"pk": instance.pk}``).
    ``queue``, ``max_attempts``, ``max_lateness`` and ``priority`` are passed to
    ``schedule()`` (default: the job type's). ``offset`` and ``when`` run each time an
    instance is loaded, to remember what its job depends on: keep them cheap, reading the
    row's own fields (no queries).

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
    options = _checked_options(
        label, queue=queue, max_attempts=max_attempts, max_lateness=max_lateness, priority=priority
    )
    binding = Binding(model, bound_field, job_type, offset, when, payload, options)
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


def _datetime_field(model: type[models.Model], name: Any) -> models.DateTimeField:
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

    Per sender rather than for every sender: post_init runs for each instance of every
    model loaded, and other models should not pay for it. The dispatch_uid makes
    connecting twice (several bindings on one model) a no-op.
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


def _on_post_init(sender: type[models.Model], instance: models.Model, **kwargs: Any) -> None:
    bindings = bindings_for(type(instance))
    # With deferred fields, reading them would cost a query per instance: no snapshot,
    # and a save reads the row first instead.
    if not bindings or instance.get_deferred_fields():
        return
    snapshots = {}
    for binding in bindings:
        try:
            state = binding.state(instance)
        except Exception:
            # An instance built empty (a form's) may not satisfy the callables yet; its
            # save reports real errors. Loading must never fail because of a binding.
            continue
        snapshots[binding.label] = Snapshot(state, confirmed=True)
    instance.__dict__[SNAPSHOTS_ATTR] = snapshots


def _on_pre_save(
    sender: type[models.Model], instance: models.Model, raw: bool, using: str, **kwargs: Any
) -> None:
    if raw:
        return
    bindings = bindings_for(type(instance))
    instance.__dict__.pop(BEFORE_ATTR, None)
    if not bindings or _is_new(instance):
        return
    # An instance never loaded nor saved (built by hand with the pk of a row) has a
    # snapshot of what it was built with, which says nothing about the row.
    snapshots = {} if instance._state.adding else instance.__dict__.get(SNAPSHOTS_ATTR, {})
    for binding in bindings:
        snapshot = snapshots.get(binding.label)
        if (
            snapshot is None
            or not snapshot.confirmed
            or binding.state(instance).effective() != snapshot.state.effective()
        ):
            break
    else:
        return  # every snapshot is trusted and nothing changed: no query
    # Unsure, or a change: compare with the row as the database holds it before this save.
    previous = type(instance)._base_manager.db_manager(using).filter(pk=instance.pk).first()
    instance.__dict__[BEFORE_ATTR] = (
        {} if previous is None else {b.label: b.state(previous) for b in bindings}
    )


def _on_post_save(
    sender: type[models.Model],
    instance: models.Model,
    created: bool,
    raw: bool,
    using: str,
    update_fields: frozenset[str] | None,
    **kwargs: Any,
) -> None:
    if raw:  # loaddata writes rows as they are; jobs are not part of a fixture
        return
    bindings = bindings_for(type(instance))
    if not bindings:
        return
    read: dict[str, State] | None = instance.__dict__.pop(BEFORE_ATTR, None)
    snapshots = instance.__dict__.get(SNAPSHOTS_ATTR, {})
    for binding in bindings:
        if created:
            before = None
        elif read is not None:
            before = read.get(binding.label)
        else:
            snapshot = snapshots.get(binding.label)
            before = snapshot.state if snapshot is not None else None
        binding._saved(instance, created, before, update_fields, using)


def _on_post_delete(sender: type[models.Model], instance: models.Model, **kwargs: Any) -> None:
    for binding in bindings_for(type(instance)):
        if instance.pk is not None:
            cancel(key=binding.key_for(instance))


def _is_new(instance: models.Model) -> bool:
    """Whether this save inserts a row nobody saw before (so there is nothing to read)."""
    return instance._state.adding and (instance.pk is None or instance._meta.pk.has_default())


def _remember(instance: models.Model, binding: Binding, state: State, using: str | None) -> None:
    """Record ``state`` as the instance's snapshot, trusted once the transaction commits."""
    snapshot = Snapshot(state, confirmed=False)
    # A new dict, not an update: a copy.copy() of the instance must not share changes.
    instance.__dict__[SNAPSHOTS_ATTR] = {
        **instance.__dict__.get(SNAPSHOTS_ATTR, {}),
        binding.label: snapshot,
    }

    def confirm() -> None:
        snapshot.confirmed = True

    # Runs at once outside a transaction. After a rollback it never runs, and the next
    # save reads the row instead of trusting a state that was never committed.
    transaction.on_commit(confirm, using=using)


SIGNALS: tuple[tuple[ModelSignal, Callable[..., None]], ...] = (
    (post_init, _on_post_init),
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
