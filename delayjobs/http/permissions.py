"""The permissions the API checks: the admin's, as app_label.codename."""

from __future__ import annotations

VIEW = "delayjobs.view_delayedjob"
ADD = "delayjobs.add_delayedjob"
CANCEL = "delayjobs.cancel_delayedjob"
RESCHEDULE = "delayjobs.reschedule_delayedjob"
RETRY = "delayjobs.retry_delayedjob"
