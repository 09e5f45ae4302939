"""System checks of the DELAYJOBS settings, the registered job types and the HTTP API
(interfaces). ``apps.ready`` imports this package, which registers them. Ids are stable
(``delayjobs.E001`` ...) so that projects can silence one on purpose. Each setting is
checked by its row of ``delayjobs.conf.SETTINGS`` (``settings``), the Redis settings
together in ``redis``; the checks Django runs are in ``registered``.
"""

from delayjobs.checks.registered import check_http_api, check_job_types, check_settings

__all__ = ["check_http_api", "check_job_types", "check_settings"]
