"""The chaos tool's scenarios (``tools/chaos_scenarios.py``) as CI runs them, each on
PostgreSQL clusters the tool makes for itself:

- the five faults of a job-queue chaos harness, one after another under a steady stream
  of tasks (backends terminated, connection slots exhausted by another client, a session
  idle in a transaction, workers SIGKILLed, the server restarted): nothing lost, nothing
  completed twice, every invariant of the checker held, and each fault's figures
  reported, the pool back to its baseline throughput before the next fault;
- a partition: the pool in a network namespace of its own, cut off from the server for
  half a lease (no lease may be lost), then for three leases (the leases in flight
  expire; the pool takes its tasks back once the link returns): nothing lost, nothing
  completed twice, every invariant held, the time to recover and the leases lost
  reported;
- a failover: a pool of 4 running 2,000 tasks against a primary with a synchronous
  streaming standby, through a multi-host URL with ``target_session_attrs=read-write``;
  the primary's postmaster is SIGKILLed and the standby promoted, and the pool carries
  on against it with nothing lost, nothing completed twice, every charge applied once or
  reconciled.

Where clusters or a network namespace cannot be made (no Debian cluster tools, no
iproute2, not root) the tests skip, which fails them under CI. Each prints the tool's
output, figures included.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runifold_sync.store.postgres.url import parse_target
from tests.system.test_chaos import INVARIANTS, SEED

# Pools of worker processes under faults for tens of seconds each: outside the default
# run, inside the run of every test (`pytest -m 'slow or not slow'`, as .ci/run runs it).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHAOS = ROOT / "tools" / "chaos.py"
HARNESS = ["terminate-backends", "pool-exhaustion", "idle-in-transaction", "worker-kills", "pg-restart"]
# What each fault must have done for its figures to mean anything.
DID = {
    "terminate-backends": "backends terminated",
    "pool-exhaustion": "connections held",
    "worker-kills": "kills",
    "pg-restart": "restarted",
    "failover": "primary killed",
    "partition-short": "leases held at the cut",
    "partition-long": "leases held at the cut",
}


def _scenario(tmp_path: Path, *args: str, timeout_s: float) -> dict[str, Any]:
    figures = tmp_path / "figures.json"
    command = [sys.executable, str(CHAOS), "--store", "postgres", "--seed", str(SEED), "--json", str(figures)]
    command += ["--workdir", str(tmp_path / "work"), "--duration-limit", str(timeout_s - 60), *args]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    print(proc.stdout)
    cannot = ("cannot make the clusters", "cannot make a network namespace")
    if proc.returncode == 2 and any(text in proc.stdout for text in cannot):
        pytest.skip(proc.stdout.strip().splitlines()[-1])  # a failure under CI (tests/support/ci.py)
    assert proc.returncode == 0, (
        f"chaos failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
    )
    printed = dict(re.findall(r"^invariant (.+): (\d+)$", proc.stdout, re.MULTILINE))
    assert set(printed) == INVARIANTS
    assert all(value == "0" for value in printed.values()), printed
    result: dict[str, Any] = json.loads(figures.read_text())
    assert result["shortfalls"] == []
    return result


def _fault_held(result: dict[str, Any], name: str) -> dict[str, Any]:
    fault: dict[str, Any] = result["scenarios"][name]
    assert (fault["lost"], fault["completed_twice"]) == (0, 0), fault
    if name in DID:
        assert fault["did"][DID[name]], fault["did"]
    assert fault["completed_after"] > 0  # the pool went on working after the fault
    return fault


@pytest.mark.timeout(400)
def test_each_harness_fault_loses_nothing_and_the_pool_recovers(tmp_path: Path) -> None:
    result = _scenario(
        tmp_path, "--scenario", "harness", "--baseline-s", "4", "--fault-s", "3", "--recovery-s", "8",
        timeout_s=380,
    )  # fmt: skip
    assert list(result["scenarios"]) == ["baseline", *HARNESS]
    assert result["scenarios"]["baseline"]["throughput_per_s"] > 0
    for name in HARNESS:
        fault = _fault_held(result, name)
        # Back to the baseline's throughput within the 8 s before the next fault.
        assert fault["time_to_recover_s"] is not None, (name, fault)
        assert fault["throughput_after_recovery"] is not None, (name, fault)
    assert result["scenarios"]["idle-in-transaction"]["did"]["xmin held"] > 0


def test_a_multi_host_url_with_target_session_attrs_reaches_libpq_whole() -> None:
    url = "postgresql://app@db-a:5432,db-b:5433/jobs?target_session_attrs=read-write"
    assert parse_target(url).conninfo == url
    conninfo = "host=db-a,db-b port=5432,5433 dbname=jobs target_session_attrs=read-write"
    assert parse_target(conninfo).conninfo == conninfo


@pytest.mark.timeout(300)
def test_a_pool_cut_off_from_the_server_loses_no_task_and_recovers(tmp_path: Path) -> None:
    """Leases of 4 s, heartbeats every 1 s: a cut of 2 s while a worker holds a lease
    costs no lease; a cut of 12 s costs the leases in flight, and each such task is taken
    back once the link returns and completes once."""
    result = _scenario(
        tmp_path, "--scenario", "partition", "--baseline-s", "4", "--recovery-s", "8", timeout_s=280
    )  # fmt: skip
    assert list(result["scenarios"]) == ["baseline", "partition-short", "partition-long"]
    short, long = (_fault_held(result, name) for name in ("partition-short", "partition-long"))
    assert short["did"]["cut s"] == 2.0 and long["did"]["cut s"] == 12.0
    assert short["leases_lost"] == 0, short
    for fault in (short, long):
        assert fault["time_to_recover_s"] is not None, fault


@pytest.mark.timeout(600)
def test_a_pool_of_four_carries_on_through_a_failover_to_the_synchronous_standby(tmp_path: Path) -> None:
    """2,000 tasks enqueued at the start; 8 s in, the primary dies and the standby is
    promoted 1 s later. Every task completes once, and each charge (the non-idempotent
    effect) is in the ledger once: applied by the run its journal records, or found by a
    reconcile after the failover."""
    result = _scenario(
        tmp_path, "--scenario", "failover", "--tasks", "2000", "--arrival-rate", "0", "--baseline-s", "8",
        timeout_s=580,
    )  # fmt: skip
    fault = _fault_held(result, "failover")
    assert result["scenarios"]["baseline"]["throughput_per_s"] > 0  # tasks finished before the kill
    assert fault["completed_after"] > 100
    assert result["invariants"]["non-idempotent effects run twice"] == 0
    assert result["figures"]["ledger lines"] >= 3 * 2000
