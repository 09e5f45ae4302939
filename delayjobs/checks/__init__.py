"""System checks of the DELAYJOBS settings, the registered job types and the HTTP API
(interfaces). ``apps.ready`` imports this package, which registers them. Ids are stable
(``delayjobs.E001`` ...) so that projects can silence one on purpose. Each setting is
checked by its row of ``delayjobs.conf.SETTINGS`` (``settings``), the Redis settings
together in ``redis``; the checks Django runs are in ``registered``, with the tag of those
``run_delay_consumer`` runs (``CONSUMER_CHECKS``).
"""

from delayjobs.checks.registered import (
    CONSUMER_CHECKS,
    check_http_api,
    check_job_types,
    check_settings,
)

__all__ = ["CONSUMER_CHECKS", "check_http_api", "check_job_types", "check_settings"]
