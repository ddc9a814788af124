"""Network namespaces for the partition tests: the namespace machinery of
``tools/netns.py`` (which the chaos tool's ``partition`` scenario shares) as pytest
fixtures, and a private cluster (``tests/support/pgcluster.py``) made to listen on a
namespace's host address (the shared test server listens on 127.0.0.1 only).

Where a namespace cannot be made (not root, no iproute2) the tests that need one skip,
except under ``CI``, where that is a failure: a partition left untested is a hole.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from tests.support.pgcluster import PrivateCluster

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

from netns import Namespace, NetnsError, allow_namespace, create, disallow_namespace  # noqa: E402

__all__ = ["Namespace", "NetnsError", "create", "listen_on_namespace", "stop_listening"]


def _config(cluster: PrivateCluster) -> Path:
    return Path(f"/etc/postgresql/{cluster.version}/{cluster.name}")


def listen_on_namespace(cluster: PrivateCluster, ns: Namespace) -> str:
    """Have ``cluster`` listen on the namespace's host address too (and trust the
    namespace's address, as the test cluster trusts 127.0.0.1), restarting it; returns
    the admin URL a process inside the namespace uses."""
    allow_namespace(_config(cluster), ns)
    cluster.ctl("restart")
    cluster.wait_until_reachable()
    return f"postgresql://postgres@{ns.host_ip}:{cluster.port}/postgres"


def stop_listening(cluster: PrivateCluster) -> None:
    """Undo :func:`listen_on_namespace`: the cluster listens on 127.0.0.1 alone again."""
    disallow_namespace(_config(cluster))
    cluster.ctl("restart")
    cluster.wait_until_reachable()


@attrs.frozen
class NamespaceAttempt:
    """A namespace, or why there is none."""

    namespace: Namespace | None
    why_not: str = ""


@pytest.fixture(scope="module")
def network_namespace_attempt() -> Iterator[NamespaceAttempt]:
    try:
        ns = create()
    except (NetnsError, OSError, subprocess.TimeoutExpired) as exc:
        if os.environ.get("CI"):
            pytest.fail(f"no network namespace: {exc}; CI is set, so the partitions must be tested")
        yield NamespaceAttempt(None, f"no network namespace: {exc}")
        return
    try:
        yield NamespaceAttempt(ns)
    finally:
        ns.delete()


@pytest.fixture(scope="module")
def network_namespace(network_namespace_attempt: NamespaceAttempt) -> Iterator[Namespace]:
    """A namespace for this test module, its link restored after each use; skips (or
    fails under ``CI``) where none can be made."""
    if network_namespace_attempt.namespace is None:
        pytest.skip(network_namespace_attempt.why_not)
    yield network_namespace_attempt.namespace
