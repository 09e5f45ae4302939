"""An HTTP API for other services: schedule, read, cancel, reschedule and retry jobs as JSON.

Off unless mounted: add ``path("delayjobs/api/", include("delayjobs.http.urls"))`` to the
project's URLs. Requests authenticate with an API key (``Authorization: Bearer ...``,
see ``delayjobs.api_keys``) or a Django session, and need the same permissions as the
admin's actions. ``openapi.json`` under the mount point describes every endpoint.

It uses only the public API (``delayjobs.api``, the job types and their validation, the
models) and never imports the admin. Nothing is imported here, so that importing the package
touches no model.
"""
