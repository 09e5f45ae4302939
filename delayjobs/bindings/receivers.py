"""The model signals' receivers that keep bound jobs in step, and the system check of
the bindings (``delayjobs.E100``).

``pre_save`` reads and judges the row before the save, ``post_save`` acts on it (see the
docstring of ``delayjobs.bindings.declare`` for the rules), ``post_delete`` cancels the job.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, NamedTuple

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import models, transaction
from django.db.models.signals import (
    ModelSignal,
    class_prepared,
    post_delete,
    post_save,
    pre_save,
)
from django.utils import timezone

from delayjobs.api.verbs import cancel
from delayjobs.bindings.binding import (
    Binding,
    State,
    bindings_for,
    every_binding,
    forget_classes,
)

log = logging.getLogger("delayjobs.bindings")  # the old path: users' LOGGING names it

#: Where pre_save leaves, for post_save, what it read and judged: ``{depth: {binding label:
#: _Pending}}``, one entry per save of the instance under way (see ``_save_depth``).
BEFORE_ATTR = "_delayjobs_bindings_before"


class _Pending(NamedTuple):
    """What pre_save found for one binding, for post_save to act on."""

    #: The state of the row before the save; ``None``: no row (an insert), or unreadable.
    before: State | None
    #: What the save writes, as an instance: the instance itself for a full save, else the
    #: row read before overlaid with the saved fields.
    after: models.Model


def connect(model: type[models.Model]) -> None:
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
    if any(issubclass(sender, binding.model) for binding in every_binding()):
        forget_classes()
        connect(sender)


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
    for binding in every_binding():
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
