"""The test harness seen from a child process: it opens the very database the test writes to.

Moved out of tests/integration/test_services.py: it starts a Python process.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.db import connection

from tests.conftest import REPO_ROOT, subprocess_env

pytestmark = pytest.mark.subprocess


@pytest.mark.django_db(transaction=True)
def test_subprocess_sees_the_test_database() -> None:
    """What consumer_process relies on: a child process opens this test's database."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM django_migrations")
        (expected,) = cursor.fetchone()
    code = (
        "import django; django.setup()\n"
        "from django.db import connection\n"
        "with connection.cursor() as c:\n"
        "    c.execute('SELECT COUNT(*) FROM django_migrations')\n"
        "    print(connection.settings_dict['NAME'], c.fetchone()[0])\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == [str(connection.settings_dict["NAME"]), str(expected)]
