"""Run the README's Quick start, verbatim, in the current (empty) directory.

The code blocks of the README's "Quick start" section are taken in order:

- a ``bash`` block runs line by line in a shell; ``python manage.py run_delay_consumer``
  runs until the work the Quick start scheduled is done, then gets SIGTERM (as Ctrl-C);
- a ``python`` block whose first line is ``# path/to/file.py`` is that file (``(at the
  end)`` after the path: appended to it);
- a ``python`` block whose first line is ``# python manage.py shell`` is fed to that shell.

Then it checks what the Quick start says happens: the first order closed, the paid one
untouched, its job cancelled. Standard library only; run it with the project's venv first
on PATH. Usage: python quickstart.py README.md
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

SECTION = re.compile(r"^## Quick start\n(.*?)(?=^## )", re.M | re.S)
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)
FILE_BLOCK = re.compile(r"# (\S+\.py)( \(at the end\))?")
CONSUMER = "python manage.py run_delay_consumer"
#: The Quick start's jobs are due 10 s after they are scheduled.
CONSUMER_DEADLINE = 120.0
DONE = """
from delayjobs.models import DelayedJob
print(DelayedJob.objects.filter(status__in=["scheduled", "running"]).count())
"""
OUTCOME = """
from delayjobs.models import DelayedJob
from orders.models import Order
orders = {o.pk: o.status for o in Order.objects.order_by("pk")}
jobs = {j.key: j.status for j in DelayedJob.objects.all()}
assert orders == {1: "closed", 2: "paid"}, orders
assert jobs == {"order:1:close": "succeeded", "order:2:close": "cancelled"}, jobs
print(f"orders {orders}, jobs {jobs}")
"""


def blocks(readme: str) -> list[tuple[str, str]]:
    section = SECTION.search(readme)
    if section is None:
        sys.exit("README.md has no '## Quick start' section")
    found = BLOCK.findall(section.group(1))
    if not found:
        sys.exit("the Quick start has no code blocks")
    return found


def run(language: str, code: str) -> None:
    first_line = code.splitlines()[0]
    if language == "bash":
        for line in code.splitlines():
            run_shell_line(line)
    elif language == "python" and first_line == "# python manage.py shell":
        print(f"$ python manage.py shell  <<< {len(code.splitlines())} lines")
        print(manage_shell(code), end="")
    elif language == "python" and (
        path := re.fullmatch(r"# (\S+\.py)( \(at the end\))?", first_line)
    ):
        target = Path(path.group(1))
        mode = "a" if path.group(2) else "w"
        print(f"{'append to' if mode == 'a' else 'write'} {target}")
        with target.open(mode) as file:
            file.write(("\n" if mode == "a" else "") + code)
    else:
        sys.exit(
            f"a {language} block the Quick start runner does not know how to run: {first_line!r}"
        )


def run_shell_line(line: str) -> None:
    command = line.split("#")[0].strip()
    if not command:
        return
    print(f"$ {command}")
    if command == CONSUMER:
        run_consumer_until_done()
    else:
        subprocess.run(["bash", "-c", command], check=True)


def run_consumer_until_done() -> None:
    """The consumer runs until nothing is scheduled or running, then stops as on Ctrl-C."""
    consumer = subprocess.Popen(CONSUMER.split())
    deadline = time.monotonic() + CONSUMER_DEADLINE
    try:
        while manage_shell(DONE).strip() != "0":
            if consumer.poll() is not None:
                sys.exit(f"the consumer exited with status {consumer.returncode}")
            if time.monotonic() > deadline:
                sys.exit(f"jobs still pending after {CONSUMER_DEADLINE:g} s")
            time.sleep(0.5)  # a poll of the database, not a wait for timing
    finally:
        consumer.send_signal(signal.SIGINT)
        status = consumer.wait(timeout=60)
    if status != 0:
        sys.exit(f"the consumer stopped with status {status} after Ctrl-C")


def manage_shell(code: str) -> str:
    """What ``python manage.py shell -c code`` printed (it fails on an exception)."""
    return subprocess.run(
        [sys.executable, "manage.py", "shell", "--no-imports", "-c", code],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def main() -> None:
    for language, code in blocks(Path(sys.argv[1]).read_text()):
        run(language, code)
    print("The Quick start did what it says:", manage_shell(OUTCOME), end="")


if __name__ == "__main__":
    main()
