from __future__ import annotations

from delayjobs.management.base import PauseCommand


class Command(PauseCommand):
    help = (
        "Resume a paused queue or job type: its scheduled jobs run again where they were, "
        "without a restart of consumers. Or resume a recurring schedule (--schedule): it "
        "ticks again from its next tick; the ticks while it was paused never run."
    )
    resume = True
