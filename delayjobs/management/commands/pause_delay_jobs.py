from __future__ import annotations

from delayjobs.management.base import PauseCommand


class Command(PauseCommand):
    help = (
        "Pause a queue or a job type: no consumer claims its jobs, which stay scheduled, "
        "until resume_delay_jobs. Running consumers follow without a restart."
    )
    resume = False
