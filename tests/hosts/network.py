"""Executor hosts as network namespaces: a bridge in the root namespace holds the test
network's first address (the database and the provider listen there), each host is a
namespace with one end of a veth pair on that bridge and an address of its own. Nothing routes
anywhere else: a namespace has the network's own route only, so its traffic reaches the root
namespace's address or another host, never beyond.

A **partition** drops packets on the host's interface in its namespace, at the netdev ingress
and egress hooks of nftables (so the kernel's TCP sees lost packets, as on a cut wire, not a
local error): ``cut(host)`` everything both ways; ``heal`` removes the table. ``connects``
probes a cut from the host's side (a new connection's handshake), so that a test confirms a cut
holds before it relies on it. (A rule that dropped only the database's answers, matching
``ip saddr``, ``tcp sport`` and ``tcp dport``, let an established connection's answer through
now and then under load: the partition test no longer uses one, see its comments.)

Each network takes a free ``10.231.<n>.0/24`` (a lock file per ``n`` under /run/lock), and its
names carry the creating process's pid, so that concurrent runs never share one and a later run
removes what a killed run left (``sweep_leftovers``). Everything is removed at the end, also
when the test failed."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

SUBNETS = range(0, 64)  # 10.231.<n>.0/24
LOCKS = Path("/run/lock")
PREFIX = "obx"  # namespaces obx<pid>h<i>, bridge obx<pid>br (interface names: 15 bytes at most)
PARTITION_TABLE = "outbox_partition"


class NetworkUnavailable(Exception):
    """This machine cannot make network namespaces (not root, no ip or nft, a sandbox)."""


def run(*argv: str, stdin: str | None = None) -> None:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")


def unavailable() -> str | None:
    """Why namespaces cannot be made here (one line), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (.ci/run installs nftables; ip is iproute2)"
    probe = f"{PREFIX}{os.getpid()}probe"
    try:
        run("ip", "netns", "add", probe)
        run("ip", "netns", "exec", probe, "nft", "list", "tables")
    except RuntimeError as exc:
        return f"cannot make a network namespace with nftables here: {exc}"
    finally:
        subprocess.run(["ip", "netns", "delete", probe], capture_output=True, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_leftovers() -> None:
    """Remove the namespaces and bridges of runs whose process is gone (a killed test)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False)
    for name in re.findall(rf"^({PREFIX}(\d+)h\d+)", listed.stdout, re.M):
        if not _alive(int(name[1])):
            subprocess.run(["ip", "netns", "delete", name[0]], capture_output=True, check=False)
    for name in re.findall(rf"\d+: ({PREFIX}(\d+)br)[:@]", links.stdout):
        if not _alive(int(name[1])):
            subprocess.run(["ip", "link", "delete", name[0]], capture_output=True, check=False)


@dataclass(frozen=True)
class Host:
    name: str  # the namespace
    address: str

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.name, *argv]


@dataclass
class Network:
    subnet: int
    hosts: list[Host] = field(default_factory=list)

    @property
    def address(self) -> str:
        """The root namespace's address on the network (the database's, the provider's)."""
        return f"10.231.{self.subnet}.1"

    @property
    def cidr(self) -> str:
        return f"10.231.{self.subnet}.0/24"

    def cut(self, host: Host) -> None:
        """Drop everything ``host`` sends and receives (a partition)."""
        self._drop(host, ingress=["drop"], egress=["drop"])

    def _drop(self, host: Host, *, ingress: list[str], egress: list[str]) -> None:
        chains = "".join(
            f"  chain {hook} {{ type filter hook {hook} device eth0 priority 0; policy accept;\n"
            + "".join(f"    {rule}\n" for rule in rules)
            + "  }\n"
            for hook, rules in (("ingress", ingress), ("egress", egress))
            if rules
        )
        with suppress(RuntimeError):
            self.heal(host)
        run(
            *host.command("nft", "-f", "-"),
            stdin=f"table netdev {PARTITION_TABLE} {{\n{chains}}}\n",
        )

    def heal(self, host: Host) -> None:
        run(*host.command("nft", "delete", "table", "netdev", PARTITION_TABLE))

    def connects(self, host: Host, port: int, *, timeout: float = 0.5) -> bool:
        """Whether a new TCP connection from ``host`` to the root address's ``port`` completes
        within ``timeout`` seconds: a probe of a cut (the server's answer to the handshake is
        what ``cut_replies`` drops), which a test confirms before it relies on the cut."""
        probe = (
            "import socket, sys\n"
            "try:\n"
            f"    socket.create_connection(({self.address!r}, {port}), timeout={timeout}).close()\n"
            "except OSError:\n"
            "    sys.exit(1)\n"
        )
        done = subprocess.run(
            host.command(sys.executable, "-c", probe), capture_output=True, check=False
        )
        return done.returncode == 0


@contextmanager
def _subnet_lock() -> Iterator[tuple[int, IO[str]]]:
    for n in SUBNETS:
        handle = (LOCKS / f"outbox-net-10.231.{n}.lock").open("w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        try:
            yield n, handle
        finally:
            handle.close()
        return
    raise NetworkUnavailable("every test subnet 10.231.0-63.0/24 is taken by another run")


@contextmanager
def network(hosts: int) -> Iterator[Network]:
    """A bridge and ``hosts`` namespaces on a free test subnet, removed at the end."""
    sweep_leftovers()
    tag = f"{PREFIX}{os.getpid()}"
    bridge = f"{tag}br"
    with _subnet_lock() as (subnet, _):
        made = Network(subnet)
        try:
            run("ip", "link", "add", bridge, "type", "bridge")
            run("ip", "addr", "add", f"{made.address}/24", "dev", bridge)
            run("ip", "link", "set", bridge, "up")
            for i in range(1, hosts + 1):
                host = Host(f"{tag}h{i}", f"10.231.{subnet}.{10 + i}")
                run("ip", "netns", "add", host.name)
                made.hosts.append(host)
                root_end = f"{tag}v{i}"
                run(
                    "ip",
                    "link",
                    "add",
                    root_end,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    host.name,
                )
                run("ip", "link", "set", root_end, "master", bridge, "up")
                run(*host.command("ip", "addr", "add", f"{host.address}/24", "dev", "eth0"))
                run(*host.command("ip", "link", "set", "eth0", "up"))
                run(*host.command("ip", "link", "set", "lo", "up"))
            yield made
        finally:
            for host in made.hosts:
                _kill_inside(host)
                subprocess.run(
                    ["ip", "netns", "delete", host.name], capture_output=True, check=False
                )
            subprocess.run(["ip", "link", "delete", bridge], capture_output=True, check=False)


def _kill_inside(host: Host) -> None:
    """SIGKILL what still runs in the namespace (a test that failed before it stopped them)."""
    found = subprocess.run(
        ["ip", "netns", "pids", host.name], capture_output=True, text=True, check=False
    )
    for pid in found.stdout.split():
        with suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), 9)
