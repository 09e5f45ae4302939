"""Foundation: the clock, database helpers, log fields, display, metrics, the backoff and
the version.

Modules here import only ``delayjobs.models``, ``conf``, ``exceptions``, ``names`` and
each other; everything else in delayjobs builds on them.
"""
