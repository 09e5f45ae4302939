"""The retry backoff: exponential, capped, with equal jitter."""

import random
from datetime import timedelta

#: 2**32 times the smallest base (1 µs) is already past an hour; bounding the exponent keeps
#: the float finite for any attempt count.
MAX_EXPONENT = 32


def equal_jitter_backoff(attempt: int, *, base: timedelta, cap: timedelta) -> timedelta:
    """The wait before the attempt after failed attempt number ``attempt`` (1 = the first).

    Exponential backoff with *equal jitter*: the ceiling is ``base * 2 ** (attempt - 1)``,
    at most ``cap``; the wait is drawn uniformly from ``[ceiling / 2, ceiling]``. Half of
    it is fixed, so a retry never comes back almost at once; half is random, so a burst of
    failures does not retry in lock step. (Full jitter would draw from ``[0, ceiling]``.)
    ``attempt`` below 1 counts as 1; the exponent is bounded by MAX_EXPONENT.
    """
    exponent = min(max(attempt - 1, 0), MAX_EXPONENT)
    ceiling = min(base.total_seconds() * 2**exponent, cap.total_seconds())
    return timedelta(seconds=random.uniform(ceiling / 2, ceiling))
