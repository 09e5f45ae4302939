"""What each endpoint does, once the request is authenticated, permitted and parsed.

Handlers call the public API (``delayjobs.api``), which keeps every rule of a valid job
and of each transition; its exceptions become error responses in ``views``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.utils.translation import gettext

from delayjobs import api
from delayjobs.exceptions import InvalidTransition, JobNotFound
from delayjobs.http import permissions
from delayjobs.http.audit import audit, audit_scheduled
from delayjobs.http.call import MAX_ID, Call, Reply
from delayjobs.http.errors import ApiError
from delayjobs.http.serialize import iso, job_json
from delayjobs.jobtypes import registry
from delayjobs.models import DelayedJob, JobStatus, jobs_database

# Handlers ---------------------------------------------------------------------------


def schedule_job(call: Call) -> Reply:
    [spec], [moved] = _prepare_schedule(call, [call.body], bulk=False)
    before = _due_times(moved)
    job = api.schedule(**spec)
    audit_scheduled(call, [job], before)
    return Reply(201, call.job_body(job), {"Location": call.url("job", job_id=job.pk)})


def schedule_jobs(call: Call) -> Reply:
    specs, moved = _prepare_schedule(call, call.body["jobs"], bulk=True)
    before = _due_times(*moved)
    jobs = api.schedule_many(specs)
    audit_scheduled(call, jobs, before)
    return Reply(201, {"jobs": [call.job_body(job) for job in jobs]})


def get_job(call: Call) -> Reply:
    job = _job(call)
    return Reply(200, job_json(job, job.history.order_by("started_at", "id")))


def cancel_job(call: Call) -> Reply:
    return _cancel(call, _job(call))


def cancel_job_by_key(call: Call) -> Reply:
    key = call.body["key"]
    holder = DelayedJob.objects.active().filter(key=key).first()
    if holder is None:
        raise JobNotFound(f"No scheduled or running job holds key {key!r}.")
    return _cancel(call, holder)


def reschedule_job(call: Call) -> Reply:
    was = _locked_field(call, "run_at")
    job = api.reschedule(_job_id(call), **call.body)
    message = gettext("Rescheduled through the HTTP API from %(old)s to %(new)s (%(actor)s).")
    audit(call, [(job, message % {"old": iso(was), "new": iso(job.run_at), "actor": call.actor})])
    return Reply(200, call.job_body(job))


def retry_job(call: Call) -> Reply:
    was = _locked_field(call, "status")
    job = api.retry(_job_id(call))
    message = gettext("Retried through the HTTP API (was %(status)s; %(actor)s).")
    audit(call, [(job, message % {"status": was, "actor": call.actor})])
    return Reply(200, call.job_body(job))


def _cancel(call: Call, job: DelayedJob) -> Reply:
    cancelled = api.cancel(job.pk)
    job.refresh_from_db()
    if not cancelled:
        raise InvalidTransition(
            f"Cannot cancel job {job.pk}: it is {job.status}; only a scheduled job can be "
            f"cancelled (a running job is not interrupted)."
        )
    message = gettext("Cancelled through the HTTP API (%(actor)s).")
    audit(call, [(job, message % {"actor": call.actor})])
    return Reply(200, call.job_body(job))


def _job_id(call: Call) -> int:
    job_id: int = call.path["job_id"]
    if job_id > MAX_ID:
        raise JobNotFound(f"Job {job_id} does not exist.")
    return job_id


def _locked_field(call: Call, name: str) -> Any:
    """One field of the job, its row locked until the operation's transaction ends: what
    it was before the change, for the audit log."""
    job_id = _job_id(call)
    jobs = DelayedJob.objects.using(jobs_database()).select_for_update().filter(pk=job_id)
    rows = jobs.values_list(name, flat=True)
    if not rows:
        raise JobNotFound(f"Job {job_id} does not exist.")
    return rows[0]


def _job(call: Call) -> DelayedJob:
    job_id = _job_id(call)
    job = DelayedJob.objects.select_related("content_type").filter(pk=job_id).first()
    if job is None:
        raise JobNotFound(f"Job {job_id} does not exist.")
    return job


# Scheduling: job types open to the API, and replace -------------------------------------


def _prepare_schedule(
    call: Call, specs: Sequence[dict[str, Any]], *, bulk: bool
) -> tuple[list[dict[str, Any]], list[DelayedJob | None]]:
    """The specs to give schedule() and, for each, the job its replace will move (or None).

    Refuses (before anything is written) a job type that is not open to the API, a replace
    without the permission to move jobs, and a replace that would turn the job holding the
    key into another job type or move it to another queue.
    """
    if any(spec.get("replace") for spec in specs) and not call.user.has_perm(
        permissions.RESCHEDULE
    ):
        raise ApiError(
            "permission_denied",
            f"replace: true moves the job already holding the key: it needs the permission "
            f"{permissions.RESCHEDULE} as well.",
        )
    _refuse_closed_job_types(specs, allowed=_private_types_allowed(call), bulk=bulk)
    _refuse_repeated_keys(specs)
    prepared: list[dict[str, Any]] = []
    moved: list[DelayedJob | None] = []
    for index, spec in enumerate(specs):
        holder = _replaceable_holder(call, spec, f"jobs[{index}]." if bulk else "")
        # No holder now: a job that takes the key meanwhile is a 409, never moved unchecked.
        prepared.append({**spec, "replace": holder is not None} if "replace" in spec else spec)
        moved.append(holder)
    return prepared, moved


def _private_types_allowed(call: Call) -> frozenset[str]:
    """The private job types the request's key may schedule (none for a session)."""
    names = call.api_key.job_types if call.api_key is not None else []
    return (
        frozenset(name for name in names if isinstance(name, str))
        if isinstance(names, list)
        else frozenset()
    )


def _refuse_closed_job_types(
    specs: Sequence[dict[str, Any]], *, allowed: frozenset[str], bulk: bool
) -> None:
    """400 for a job type that is not registered, or neither ``public`` nor on the key's
    list, alike: the API must not tell which internal job types exist, nor list any."""
    errors: dict[str, str] = {}
    for index, spec in enumerate(specs):
        name = spec["job_type"]
        if name not in registry or not (registry.get(name).public or name in allowed):
            errors[f"jobs[{index}].job_type" if bulk else "job_type"] = (
                f"Unknown job type {name!r}."
            )
    if errors:
        path, message = next(iter(errors.items()))
        detail = f"{path.removesuffix('.job_type')}: {message}" if bulk else message
        raise ApiError("invalid", detail, fields=errors)


def _replaceable_holder(call: Call, spec: dict[str, Any], prefix: str) -> DelayedJob | None:
    """The scheduled job ``spec``'s replace may move, locked; None without one; 409 if the
    job holding the key may not be moved over HTTP."""
    if not spec.get("replace"):
        return None
    key = spec["key"]
    holder = (
        DelayedJob.objects.using(jobs_database())
        .select_for_update()
        .active()
        .filter(key=key)
        .first()
    )
    if holder is None:
        return None
    if holder.status != JobStatus.SCHEDULED:
        reason = f"it is {holder.status} and cannot be moved; schedule again once it ends."
    elif (holder.job_type, holder.queue) != (
        spec["job_type"],
        spec.get("queue") or registry.get(spec["job_type"]).queue,
    ):
        reason = (
            f"it is a {holder.job_type!r} job on queue {holder.queue!r}, and replace over HTTP "
            f"never changes a job's job type or queue. Cancel that job and schedule a new one."
        )
    else:
        return holder
    raise key_taken(key, holder.pk, field=f"{prefix}key", reason=reason, can_view=call.can_view)


def key_taken(
    key: str, holder_id: int | None, *, field: str, reason: str, can_view: bool
) -> ApiError:
    """The 409 for a key an active job holds. A caller who may view jobs learns which job
    and why; any other caller gets one answer whatever the job (of a job type it may not
    schedule, running, or plain taken): the key is not free, which any schedule with it
    would tell, and nothing more."""
    index = field.removesuffix("key").removesuffix(".")
    where = f"{index}: " if index else ""
    if can_view:
        held = f" (job {holder_id})" if holder_id is not None else ""
        detail = f"{where}An active job already holds key {key!r}{held}: {reason}"
        extra: dict[str, Any] = {"existing_id": holder_id}
    else:
        detail = f"{where}Key {key!r} is taken: an active job holds it."
        extra = {}
    return ApiError("duplicate_key", detail, fields={field: detail}, extra=extra)


def _refuse_repeated_keys(specs: Sequence[dict[str, Any]]) -> None:
    """409 for a key given to two jobs of one request: both cannot hold it."""
    seen: set[str] = set()
    for index, spec in enumerate(specs):
        key = spec.get("key")
        if key is None:
            continue
        if key in seen:
            detail = f"jobs[{index}]: key {key!r} is given to an earlier job of this request too."
            raise ApiError("duplicate_key", detail, fields={f"jobs[{index}].key": detail})
        seen.add(key)


def _due_times(*holders: DelayedJob | None) -> dict[int, Any]:
    """When each job a replace moves was due, before: for the audit log."""
    return {holder.pk: holder.run_at for holder in holders if holder is not None}
