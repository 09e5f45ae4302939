from __future__ import annotations

from delayjobs.management.base import PauseCommand


class Command(PauseCommand):
    help = (
        "Pause a queue or a job type (no consumer claims its jobs, which stay scheduled) "
        "until resume_delay_jobs; running consumers follow without a restart. Or pause a "
        "recurring schedule (--schedule): no tick makes a job, and its coming ticks' jobs "
        "are cancelled."
    )
    resume = False
