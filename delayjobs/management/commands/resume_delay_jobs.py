from __future__ import annotations

from delayjobs.management.base import PauseCommand


class Command(PauseCommand):
    help = (
        "Resume a paused queue or job type: its scheduled jobs run again where they were, "
        "without a restart of consumers."
    )
    resume = True
