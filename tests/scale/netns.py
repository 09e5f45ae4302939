"""Network namespaces joined to this host by veth pairs, and partitions that drop packets.

Each namespace gets two veth pairs, one to reach Redis and one to reach PostgreSQL, each
a /30 of 10.216.N.0/26 (N: a third octet no address of this host uses). The servers
listen on the host ends; a process started with ``Namespace.prefix`` reaches them at
those addresses only, so cutting one link cuts it off from one server and not the other.

A cut puts the ``blackhole`` queueing discipline on both ends of the link: every packet
sent either way is dropped, silently. No RST, no ICMP, no "connection refused": the
process sees what it sees on a real partition, silence until its own timeouts fire.
(``netem loss 100%`` would do the same but needs the sch_netem module, which not every
kernel loads; ``blackhole`` is built into every kernel with queueing disciplines.)

Names carry a random tag, so a run that crashed leaves nothing a later run collides with;
everything created is deleted on exit, also when creating the rest failed.
"""

from __future__ import annotations

import ipaddress
import os
import random
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from typing import Self

from tests.support.processes import Started

#: The /16 the links are carved from (see the module docstring).
SUPERNET = "10.216.0.0/16"
COMMAND_TIMEOUT = 10.0


def ip(*args: str, namespace: str | None = None) -> None:
    """Run ``ip`` (or, with ``args[0] == "tc"``, ``tc``), in ``namespace`` if given."""
    command = list(args) if args[0] == "tc" else ["ip", *args]
    if namespace is not None:
        command = ["ip", "netns", "exec", namespace, *command]
    completed = subprocess.run(
        command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False
    )
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {completed.stderr.strip()}")


def require_root() -> None:
    """Fail (never skip) unless namespaces can be made here."""
    if os.geteuid() != 0:
        raise RuntimeError("tests/scale partitions need root (network namespaces, veth pairs)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} not found: apt-get install iproute2")


@dataclass(frozen=True)
class Link:
    """A veth pair: ``host_if`` at ``host_ip`` here, ``ns_if`` at ``ns_ip`` in ``namespace``."""

    namespace: str
    host_if: str
    ns_if: str
    host_ip: str
    ns_ip: str

    def cut(self) -> None:
        """Drop every packet either way, from now on."""
        ip("tc", "qdisc", "add", "dev", self.host_if, "root", "blackhole")
        ip("tc", "qdisc", "add", "dev", self.ns_if, "root", "blackhole", namespace=self.namespace)

    def heal(self) -> None:
        """Let packets through again (both ends; an end already healed is no error)."""
        errors = []
        for namespace, interface in ((None, self.host_if), (self.namespace, self.ns_if)):
            try:
                ip("tc", "qdisc", "del", "dev", interface, "root", namespace=namespace)
            except RuntimeError as exc:
                errors.append(str(exc))
        if len(errors) == 2:
            raise RuntimeError("; ".join(errors))


@dataclass(frozen=True)
class Namespace:
    name: str
    redis: Link
    postgres: Link

    @property
    def prefix(self) -> tuple[str, ...]:
        """What runs a command inside the namespace."""
        return ("ip", "netns", "exec", self.name)


class Network(Started):
    """``count`` namespaces, each with its Redis link and its PostgreSQL link."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.tag = secrets.token_hex(3)
        self.network = self._free_network()
        self.namespaces: list[Namespace] = []
        self._created_namespaces: list[str] = []
        self._created_links: list[str] = []

    @property
    def host_addresses(self) -> tuple[str, ...]:
        return tuple(link.host_ip for ns in self.namespaces for link in (ns.redis, ns.postgres))

    @staticmethod
    def _free_network() -> ipaddress.IPv4Network:
        """A /26 of SUPERNET that no address of this host (or route) lies in."""
        listing = (
            subprocess.run(
                ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True
            ).stdout
            + subprocess.run(
                ["ip", "-4", "route", "show"], capture_output=True, text=True, check=True
            ).stdout
        )
        candidates = list(ipaddress.ip_network(SUPERNET).subnets(new_prefix=26))
        random.shuffle(candidates)
        for candidate in candidates:
            if f"10.216.{candidate.network_address.packed[2]}." not in listing:
                return candidate
        raise RuntimeError(f"no free /26 left in {SUPERNET}")

    def start(self) -> Self:
        try:
            links = iter(self.network.subnets(new_prefix=30))
            for n in range(self.count):
                name = f"djp-{self.tag}-{n}"
                ip("netns", "add", name)
                self._created_namespaces.append(name)
                ip("link", "set", "lo", "up", namespace=name)
                self.namespaces.append(
                    Namespace(
                        name,
                        redis=self._link(name, f"djp{self.tag}{n}r", next(links)),
                        postgres=self._link(name, f"djp{self.tag}{n}p", next(links)),
                    )
                )
        except BaseException:
            self.stop()
            raise
        return self

    def _link(self, namespace: str, stem: str, subnet: ipaddress.IPv4Network) -> Link:
        host_ip, ns_ip = (str(address) for address in subnet.hosts())
        host_if, ns_if = f"{stem}h", f"{stem}n"
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        self._created_links.append(host_if)
        ip("link", "set", ns_if, "netns", namespace)
        ip("addr", "add", f"{host_ip}/30", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("addr", "add", f"{ns_ip}/30", "dev", ns_if, namespace=namespace)
        ip("link", "set", ns_if, "up", namespace=namespace)
        return Link(namespace, host_if, ns_if, host_ip, ns_ip)

    def stop(self) -> None:
        """Delete every link and namespace made, each on its own: one failure skips none."""
        errors = []
        for host_if in self._created_links:  # deleting one end deletes the pair
            try:
                ip("link", "del", host_if)
            except RuntimeError as exc:
                if "Cannot find device" not in str(exc):
                    errors.append(str(exc))
        for name in self._created_namespaces:
            try:
                ip("netns", "del", name)
            except RuntimeError as exc:
                errors.append(str(exc))
        self._created_links.clear()
        self._created_namespaces.clear()
        if errors:
            raise RuntimeError("cleaning up the test network failed: " + "; ".join(errors))
