"""Network namespaces: processes cut off from the database by a real network, not by a
stub, for the partition tests (``tests/support/netns.py``) and the chaos tool's
``partition`` scenario (``tools/chaos_scenarios.py``).

:func:`create` makes a namespace joined to the host by a veth pair on a private /30
(``10.231.N.0/30``: the host end ``.1``, the namespace's ``.2``); a process runs inside it
with ``ip netns exec`` (:meth:`Namespace.command`). :meth:`Namespace.cut` lets no
packet between the namespace and the host through, silently, until
:meth:`Namespace.restore` (TCP retransmits and connection attempts wait, as across a
failing network); :meth:`Namespace.set_down` sets the link down instead;
:meth:`Namespace.drop_replies` stops only what the host sends into the namespace: a
request still reaches the server and is applied, its answer is lost.

A PostgreSQL server the namespace reaches must listen on :attr:`Namespace.host_ip` and
trust :attr:`Namespace.inner_ip` (:func:`allow_namespace` writes both into a cluster's
configuration; the cluster must then restart).

Names carry the creating process's pid, and a namespace whose process is gone (a run
killed before its teardown) is deleted by the next :func:`create`. This needs iproute2
and root (``CAP_NET_ADMIN``); :func:`create` raises :class:`NetnsError` saying why where
a namespace cannot be made.

This module lives under ``tools/`` (which may not import ``tests/``); the tests import
it from there. It imports nothing of the package or of pytest.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import attrs

PREFIX = "runifold-"
LOCK = Path("/tmp/runifold-test-netns.lock")  # one creator at a time picks a free subnet
SUBNETS = 256  # 10.231.0.0/30 ... 10.231.255.0/30
NETNS_CONF = "runifold_netns.conf"


class NetnsError(Exception):
    """A namespace cannot be made or changed here (the message says why)."""


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def _run(*argv: str, check: bool = True) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")


@attrs.frozen
class Namespace:
    """A namespace this test process made, its veth pair and their addresses."""

    name: str
    index: int  # N of its subnet 10.231.N.0/30, and of its interfaces' names

    @property
    def host_if(self) -> str:
        return f"rfns{self.index}h"

    @property
    def inner_if(self) -> str:
        return f"rfns{self.index}i"

    @property
    def host_ip(self) -> str:
        return f"10.231.{self.index}.1"

    @property
    def inner_ip(self) -> str:
        return f"10.231.{self.index}.2"

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def cut(self) -> None:
        """Let no packet between the namespace and the host through from now on, in either
        direction, silently: each end of the pair holds what leaves it (a token bucket of
        one byte a second; :meth:`restore` drops what it holds). TCP takes a held packet
        for sent, so a statement in flight waits for an answer while its retransmissions
        back off, and a connection attempt for its SYN's, as across a network that fails.
        (A queue that refused them instead would tell the sender at once, and TCP retries
        a local drop within milliseconds; a link set down is kinder still.)"""
        self._hold_leaving(inside=False)
        self._hold_leaving(inside=True)

    def set_down(self) -> None:
        """Set the host end of the pair down: packets between the namespace and the host
        are dropped, and the host no longer routes to the namespace."""
        _ip("link", "set", self.host_if, "down")

    def restore(self) -> None:
        """Undo :meth:`cut`, :meth:`set_down` and :meth:`drop_replies`: the link carries
        packets again."""
        _run("tc", "qdisc", "del", "dev", self.host_if, "root", check=False)
        _run(*self.command("tc", "qdisc", "del", "dev", self.inner_if, "root"), check=False)
        _ip("link", "set", self.host_if, "up")
        deadline = time.monotonic() + 10
        while "state UP" not in _ip("link", "show", self.host_if):
            if time.monotonic() > deadline:
                raise NetnsError(f"{self.host_if} did not come up")
            time.sleep(0.05)

    def drop_replies(self) -> None:
        """Hold what the host sends into the namespace, and only that: a statement sent
        from inside still reaches the server (its retransmissions too), its answer never
        comes back."""
        self._hold_leaving(inside=False)

    def _hold_leaving(self, *, inside: bool) -> None:
        """Hold every packet leaving one end of the pair, the host's (into the namespace)
        or the namespace's (to the host): an HTB class of 8 bit/s with a one-byte burst
        takes all traffic, and a packet needs over a minute of its tokens. The bucket
        starts with tokens enough for one packet: a datagram to the discard port spends
        them at once."""
        device, peer = (self.inner_if, self.host_ip) if inside else (self.host_if, self.inner_ip)
        tc = ("ip", "netns", "exec", self.name, "tc") if inside else ("tc",)
        _run(*tc, "qdisc", "replace", "dev", device, "root", "handle", "1:", "htb", "default", "1")
        rate = ("rate", "8bit", "ceil", "8bit", "burst", "1", "cburst", "1")
        _run(*tc, "class", "replace", "dev", device, "parent", "1:", "classid", "1:1", "htb", *rate)
        send = f"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('{peer}', 9))"
        _run(*(self.command(sys.executable, "-c", send) if inside else (sys.executable, "-c", send)))

    def delete(self) -> None:
        """Remove the pair (with its host end) and the namespace; idempotent."""
        _ip("link", "del", self.host_if, check=False)
        _ip("netns", "del", self.name, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _leftovers() -> list[str]:
    """Namespaces of test processes that are gone."""
    gone = []
    for line in _ip("netns", "list").splitlines():
        match = re.match(rf"{re.escape(PREFIX)}(\d+)-(\d+)", line.split()[0]) if line.strip() else None
        if match and not _alive(int(match.group(1))):
            gone.append(match.group(0))
    return gone


def _taken() -> set[int]:
    """Subnet indexes whose veth host end exists."""
    return {int(m) for m in re.findall(r"rfns(\d+)h[@:]", _ip("-o", "link", "show"))}


def create() -> Namespace:
    """Make a namespace with its veth pair up and addressed; raises :class:`NetnsError`."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise NetnsError(f"{', '.join(missing)} not on PATH (install iproute2)")
    if os.geteuid() != 0:
        raise NetnsError("network namespaces and veth pairs need root (CAP_NET_ADMIN)")
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in _leftovers():
            index = int(name.rsplit("-", 1)[1])
            Namespace(name, index).delete()
        free = sorted(set(range(SUBNETS)) - _taken())
        if not free:
            raise NetnsError("no free 10.231.N.0/30 subnet left for a namespace")
        ns = Namespace(f"{PREFIX}{os.getpid()}-{free[0]}", free[0])
        try:
            _ip("netns", "add", ns.name)
            _ip("link", "add", ns.host_if, "type", "veth", "peer", "name", ns.inner_if)
            _ip("link", "set", ns.inner_if, "netns", ns.name)
            _ip("addr", "add", f"{ns.host_ip}/30", "dev", ns.host_if)
            _ip("link", "set", ns.host_if, "up")
            inside = ("netns", "exec", ns.name, "ip")
            _ip(*inside, "addr", "add", f"{ns.inner_ip}/30", "dev", ns.inner_if)
            _ip(*inside, "link", "set", ns.inner_if, "up")
            _ip(*inside, "link", "set", "lo", "up")
        except BaseException:
            ns.delete()
            raise
    ns.restore()  # wait for the link to be up
    return ns


def allow_namespace(config: Path, ns: Namespace) -> None:
    """Have the cluster whose configuration directory is ``config`` (``/etc/postgresql/
    <version>/<name>``) listen on the namespace's host address too and trust the
    namespace's address, as a test cluster trusts 127.0.0.1. Takes effect on restart."""
    (config / "conf.d").mkdir(exist_ok=True)
    (config / "conf.d" / NETNS_CONF).write_text(f"listen_addresses = '127.0.0.1,{ns.host_ip}'\n")
    hba = config / "pg_hba.conf"
    rule = f"host all all {ns.inner_ip}/32 trust\n"
    if rule not in hba.read_text():
        hba.write_text(hba.read_text() + rule)


def disallow_namespace(config: Path) -> None:
    """Undo :func:`allow_namespace`'s listening (on restart, 127.0.0.1 alone again)."""
    (config / "conf.d" / NETNS_CONF).unlink(missing_ok=True)
