"""Foundation: the clock, database helpers, log fields, display, metrics, lane names, the
read side of pauses, the backoff and the version.

Layer 0. Modules here import only ``delayjobs.models``, ``exceptions``, ``conf``,
``signals`` and each other; everything else in delayjobs builds on them.
"""
