"""``tools/chaos.py`` as a user runs it: a supervised pool of worker processes is killed
(SIGKILL), frozen past its lease (SIGSTOP/SIGCONT) and, on PostgreSQL, has its database
server restarted under it, and every invariant the tool prints must be 0. The server is
this test process's private cluster (``private_postgres``), never the shared one; where
none can be made the PostgreSQL runs fail under ``CI``, and elsewhere run on the shared
server without the restart.

A short profile per store, whose twenty-step tasks outgrow the head's journal tail, so
entries are committed in heads and in rows under the kills, and the long profile of the
reliability page (300 five-step tasks, 30 kills). The module is marked ``slow``: outside
the default run, inside the run of every test that .ci/run makes. The seed
is fixed so a failure replays (``RUNIFOLD_CHAOS_SEED`` picks another); the tool prints
the seed and keeps its work
directory and database when it fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runifold_sync.model.checkpoint import TAIL_ENTRIES
from tests.support.pgcluster import ClusterAttempt

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHAOS = ROOT / "tools" / "chaos.py"
SEED = int(os.environ.get("RUNIFOLD_CHAOS_SEED", "20251129"))
# Twenty steps a task: past the head's tail (checkpoint.TAIL_ENTRIES), so each task's
# journal moves into rows during the run and both of its stores are under the kills.
SHORT = {"tasks": 30, "steps": 20, "processes": 4, "kills": 8, "stops": 2}
# The short profile must stay under 3 minutes on 2 cores for both stores together, so
# each store gets half of that, everything included (on PostgreSQL the making of the
# private cluster too); a run takes about 11 s on SQLite and 14 s on PostgreSQL (with
# its server restart) on an idle machine.
SHORT_BUDGET_S = 90
LONG = {"tasks": 300, "steps": 5, "processes": 4, "kills": 30, "stops": 6}
INVARIANTS = {
    "tasks lost",
    "tasks not finished",
    "tasks unfinished without a reason",
    "wrong results",
    "fencing tokens two owners committed under",
    "steps committed more than once",
    "completed steps executed again",
    "committed outputs missing from the ledger",
    "writes accepted from a stale fencing token",
    "claims missing from the write audit",
    "non-idempotent effects run twice",
    "non-idempotent effects applied but neither recorded nor reconciled",
    "usage that decreased",
    "task ends a waiter never heard",
}


# tools/chaos.py exits 2 when every invariant held but a scenario was not exercised.
SHORTFALL = 2


class Shortfall(AssertionError):
    """A chaos run that broke no invariant but left a scenario unexercised."""


def _chaos(
    store: str, profile: dict[str, int], tmp_path: Path, *extra: str, timeout_s: float, seed: int = SEED
) -> dict[str, Any]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    figures = tmp_path / "figures.json"
    args = [sys.executable, str(CHAOS), "--store", store, "--seed", str(seed), "--json", str(figures)]
    for name, value in profile.items():
        args += [f"--{name}", str(value)]
    args += ["--workdir", str(tmp_path / "work"), "--duration-limit", str(timeout_s - 30), *extra]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    print(proc.stdout)
    if proc.returncode == SHORTFALL:
        raise Shortfall(proc.stdout)
    assert proc.returncode == 0, (
        f"chaos failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
    )
    printed = dict(re.findall(r"^invariant (.+): (\d+)$", proc.stdout, re.MULTILINE))
    expected = INVARIANTS | ({"sqlite integrity_check problems"} if store == "sqlite" else set())
    assert set(printed) == expected
    assert all(value == "0" for value in printed.values()), printed
    assert re.search(r"^recovery after kill: p50=\d+\.\d+s p99=\d+\.\d+s", proc.stdout, re.MULTILINE)
    assert f"result: PASS (seed {seed};" in proc.stdout
    result: dict[str, Any] = json.loads(figures.read_text())
    assert result["invariants"] == {name: 0 for name in expected}
    assert result["kills"] == profile["kills"] and result["stops"] == profile["stops"]
    assert result["figures"]["kills that held a task"] >= 1
    assert result["figures"]["waits woken by their task's end"] >= 1
    assert result["figures"]["stops whose task was taken over while stopped"] >= 1
    assert result["figures"]["head writes audited"] >= 1
    if profile["steps"] > TAIL_ENTRIES:
        assert result["figures"]["journal writes audited"] >= 1
    # The report counts outcomes children wrote to their pipe: a child killed (or cut off
    # by a database restart) between its completion commit and that write loses one count,
    # while the store says every task finished (the invariants above).
    # From four calls on each task runs one child task, whose completion counts too.
    runs = profile["tasks"] * (2 if profile["steps"] >= 4 else 1)
    interruptions = result["kills"] + result["db_restarts"]
    completed = result["supervisor"]["outcomes"]["completed"]
    assert runs - interruptions <= completed <= runs
    return result


def _store_args(store: str, request: pytest.FixtureRequest) -> list[str]:
    if store == "sqlite":
        return []
    attempt: ClusterAttempt = request.getfixturevalue("private_postgres_attempt")  # fails under CI
    if attempt.cluster is None:  # outside CI: a run on the shared server, without a restart
        return ["--postgres-url", request.getfixturevalue("postgres_admin_url"), "--db-restarts", "0"]
    return ["--postgres-url", attempt.cluster.admin_url, "--db-restarts", "1"]


@pytest.mark.timeout(2 * SHORT_BUDGET_S)
@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_short_chaos_profile_keeps_every_invariant(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    extra = _store_args(store, request)
    try:
        result = _chaos(store, SHORT, tmp_path / "first", *extra, timeout_s=SHORT_BUDGET_S - 5)
    except Shortfall:
        # Every invariant held, but the run never froze a task that another worker took
        # over (on the private PostgreSQL cluster this happens now and then after its
        # restart): the stale-owner scenario went unexercised, so run the next seed.
        result = _chaos(store, SHORT, tmp_path / "again", *extra, timeout_s=SHORT_BUDGET_S - 5, seed=SEED + 1)
    if "--db-restarts" in extra:
        assert result["db_restarts"] == int(extra[extra.index("--db-restarts") + 1])


@pytest.mark.timeout(900)
@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_long_chaos_profile_keeps_every_invariant(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    extra = _store_args(store, request)
    result = _chaos(store, LONG, tmp_path, *extra, timeout_s=870)
    assert result["kills"] >= 30
