"""Exceptions raised by delayjobs' public API, and those a job's attempt records.

Names follow Django's style (``ObjectDoesNotExist``, ``InvalidTask``): no ``Error`` suffix.
The second group is recorded as a job's error: a task result's
``TaskError.exception_class_path`` names these classes, and attempt rows hold the path.
"""

from __future__ import annotations


class DelayJobsError(Exception):
    """Base class of the public API's exceptions. Not raised directly."""


class InvalidJob(DelayJobsError, ValueError):
    """The arguments describe no valid job; nothing was written.

    ``field`` names the argument at fault (``"run_at"``, ``"payload"``; None when the
    arguments are wrong together), and ``index`` the job's position in a
    ``schedule_many()`` batch (None outside one), so that callers such as the HTTP API
    can point at the field without reading the message.
    """

    def __init__(self, message: str, *, field: str | None = None, index: int | None = None):
        super().__init__(message)
        self.field = field
        self.index = index


class UnknownJobType(InvalidJob, LookupError):
    """No job type is registered under this name."""

    def __init__(self, name: object, known: list[str] | None = None) -> None:
        self.name = name
        hint = f" Registered job types: {', '.join(sorted(known))}." if known else ""
        super().__init__(
            f"Unknown job type {name!r}.{hint} Register it with @delayjobs.register in a "
            f"'delay_jobs' module of an installed app.",
            field="job_type",
        )


class DuplicateJob(DelayJobsError):
    """An active (scheduled or running) job already holds this business key."""

    def __init__(self, key: str, existing_id: int | None = None, reason: str = "") -> None:
        self.key = key
        self.existing_id = existing_id
        held = f" (job {existing_id})" if existing_id is not None else ""
        advice = reason or "pass replace=True to move it, or cancel it first"
        super().__init__(f"An active job already holds key {key!r}{held}: {advice}.")


class JobNotFound(DelayJobsError, LookupError):
    """No job matches the given job or key in a state the operation applies to."""


class InvalidTransition(DelayJobsError):
    """The job's current status does not allow this operation."""


class JobTimeout(DelayJobsError, TimeoutError):
    """An execution ran past its job type's ``time_to_run``.

    Never raised inside the job (a Python thread cannot be interrupted): the consumer
    records the attempt as timed out with the stack where the job was stuck, and passes
    this to ``JobType.retry_delay`` to decide on a retry.
    """


# Recorded as a job's error -------------------------------------------------------------


class UnstorableResult(TypeError):
    """``execute`` returned a value a JSON column cannot hold: the job fails, unretried."""


class UnregisteredTask(LookupError):
    """A ``django.task`` row names a task path that no importable module defines as a
    ``@task``."""


class ForbiddenTaskPath(UnregisteredTask):
    """A row names a task path outside every installed app: nothing was imported, and no
    later attempt will import it either."""


class TaskRefused(Exception):
    """The row cannot run as a task (bad payload, or its alias is not a DelayJobsBackend).

    Not retried: the row will not get better by waiting.
    """


class UnknownTaskBackend(LookupError):
    """The row names a backend alias that is not in this process's ``TASKS``.

    Retried like an unregistered task: a deploy that adds an alias on a shared queue
    leaves consumers still on the old settings claiming its rows.
    """


class TaskCancelled(Exception):
    """Stands in ``TaskResult.errors`` for a job cancelled before it ran."""


class TaskSkipped(Exception):
    """Stands in ``TaskResult.errors`` for a job its job type chose not to run."""


class TaskExpired(Exception):
    """Stands in ``TaskResult.errors`` for a job that could start only past its lateness."""


class TaskWorkerLost(Exception):
    """Stands in ``TaskResult.errors`` for an attempt whose consumer died (lease expired)."""


class TaskFailed(Exception):
    """Stands in ``TaskResult.errors`` for an exception whose class this process cannot
    name safely: its module is not loaded here (``exception_class`` would import it), or
    the name is not an exception class. The traceback text names the original class."""
