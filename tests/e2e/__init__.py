"""End-to-end tests: every test starts processes (``manage.py run_delay_consumer``, Python
children of the harness) against the run's real Redis and database.

Each test carries the ``subprocess`` marker (set in its module) and the ``e2e`` kind
(tests/conftest.py); ``consumer_process`` refuses tests without them.
"""
