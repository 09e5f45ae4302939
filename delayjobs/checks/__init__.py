"""System checks of the DELAYJOBS settings, the registered job types and the HTTP API
(layer 7, interfaces). ``apps.ready`` imports this package, which registers them. Ids are
stable (``delayjobs.E001`` ...) so that projects can silence one on purpose. The checks of
one setting each live in ``settings`` and ``redis``, the checks Django runs in ``registered``;
they import spec and foundation modules only.
"""

from delayjobs.checks.registered import check_http_api, check_job_types, check_settings
from delayjobs.checks.settings import MAX_CONCURRENCY, MAX_DURATION, MAX_TIMEOUT_SECONDS

__all__ = [
    "MAX_CONCURRENCY",
    "MAX_DURATION",
    "MAX_TIMEOUT_SECONDS",
    "check_http_api",
    "check_job_types",
    "check_settings",
]
