"""Browser tests: Playwright drives Debian's chromium against a live server and consumers.

Every test here carries the ``browser`` marker (tests/conftest.py sets it by directory too):
tests/run.sh runs them (``DELAYJOBS_SKIP_BROWSER=1`` leaves them out locally), the matrix
legs never do.
"""
