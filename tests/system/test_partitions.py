"""Network partitions on PostgreSQL: a worker pool in a network namespace this test
makes (``tests/support/netns.py``), cut off from the database by setting its link down,
then joined again.

- A partition shorter than a lease (4 s against 8 s leases, heartbeats every 2 s, cut
  just before a beat, while steps outlast the cut): no lease is lost, no task is taken
  over, every step body runs once.
- A partition several leases long (15 s against 4 s leases), with tasks allowed a single
  claim without progress: the leases in flight are lost, and each worker reports its
  loss as a living worker's (``lease_lost``), so no task fails with the "keeps crashing
  its worker" diagnosis (a lost lease used to count as a crash); each task completes
  once, after the link returns.
- A worker cut off while its non-idempotent effect (no reconcile) runs: a worker outside
  the partition takes the task over, finds the effect's intent without its result and
  fails the task as ambiguous, to be reconciled; the effect body ran once, and the cut
  off worker's late result is refused by the fence. Resolved as applied, the task
  completes without running the effect again.

Always: nothing is lost, nothing completes twice, and the pool takes work after the link
returns. The database is this test process's private cluster (``private_postgres``),
made to listen on the namespace's veth address too. Where no namespace or cluster can be
made (not root, no iproute2), the tests skip, or fail under ``CI``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from runifold_sync import WorkflowStore, WorkflowTask, open_store
from runifold_sync.store import TaskOutcome, TaskState
from tests.support import ledger, processes
from tests.support.netns import Namespace, listen_on_namespace, stop_listening
from tests.support.pgcluster import PrivateCluster

from . import partition_app

# Pools of worker processes under faults for tens of seconds each: outside the default
# run, inside the run of every test (`pytest -m 'slow or not slow'`, as .ci/run runs it).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 90.0
HEARTBEAT_S = 2.0
SHORT_CUT_S = 4.0


@pytest.fixture
def postgres_admin_url(private_postgres: PrivateCluster) -> str:
    """The test databases (``postgres_url``) live on the private cluster."""
    return private_postgres.admin_url


@pytest.fixture(scope="module")
def reachable_namespace(
    private_postgres: PrivateCluster, network_namespace: Namespace
) -> Iterator[Namespace]:
    """The module's namespace, its processes able to reach the private cluster."""
    listen_on_namespace(private_postgres, network_namespace)
    try:
        yield network_namespace
    finally:
        stop_listening(private_postgres)


@pytest.fixture
def ns(reachable_namespace: Namespace) -> Iterator[Namespace]:
    """The namespace, its link restored whatever the test did to it."""
    try:
        yield reachable_namespace
    finally:
        reachable_namespace.restore()


def _inside(url: str, ns: Namespace) -> str:
    """``url`` (a database on the private cluster) as a process in ``ns`` reaches it."""
    parts = urlsplit(url)
    return parts._replace(netloc=f"{parts.username}@{ns.host_ip}:{parts.port}").geturl()


@contextmanager
def _pool(
    command: list[str],
    env: dict[str, str],
    stderr: Path,
    *,
    lease_s: float,
    heartbeat_s: float,
    **options: object,
) -> Iterator[subprocess.Popen[str]]:
    """``partition_app`` started with ``command`` (its interpreter, or ``ip netns exec``
    and it), killed with its workers when the block ends."""
    args = [f"--lease-s={lease_s}", f"--heartbeat-s={heartbeat_s}"]
    args += [f"--{key.replace('_', '-')}={value}" for key, value in options.items()]
    with open(stderr, "a") as err:
        proc = subprocess.Popen(
            [*command, *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        processes.kill(proc)


def _stop(proc: subprocess.Popen[str], stderr: Path) -> dict[str, object]:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr.read_text()[-4000:]
    report: dict[str, object] = json.loads(out)
    return report


def _app(python: list[str], url: str) -> list[str]:
    return [*python, "-m", "tests.system.partition_app", "--url", url]


def _ledger(path: Path) -> list[tuple[str, str]]:
    """(task, call id) of every body that started, in order."""
    return [(line[0], line[1]) for line in ledger.read(path)]


def _wait(condition: Callable[[], bool], what: str, proc: subprocess.Popen[str], stderr: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert proc.poll() is None, stderr.read_text()[-4000:]
        assert time.monotonic() < deadline, f"{what} (within {WAIT_S} s)"
        time.sleep(0.05)


def _enqueue(store: WorkflowStore, ids: list[str]) -> None:
    store.enqueue_many(
        [WorkflowTask.new("partition-flow", 1, n * 10, checkpoint_id=t) for n, t in enumerate(ids)]
    )


def _all_ended(store: WorkflowStore, ids: list[str]) -> Callable[[], bool]:
    return lambda: all(store.get_task(t).state in (TaskState.TERMINAL, TaskState.CANCELLED) for t in ids)


def _check_nothing_lost_or_twice(store: WorkflowStore, ids: list[str]) -> None:
    for n, task_id in enumerate(ids):
        record = store.get_task(task_id)
        assert (record.state, record.outcome) == (TaskState.TERMINAL, TaskOutcome.COMPLETED), record.reason
        assert record.result == n * 10 + partition_app.STEPS
        assert [e.kind for e in store.history(task_id)].count("completed") == 1


@pytest.mark.timeout(240)
def test_a_partition_shorter_than_a_lease_costs_no_lease(
    ns: Namespace, postgres_url: str, tmp_path: Path
) -> None:
    store = open_store(postgres_url)
    ids = ["short-0", "short-1"]
    _enqueue(store, ids)
    path, stderr = tmp_path / "ledger.txt", tmp_path / "pool.err"
    # Steps longer than the cut: the leases live on heartbeats alone meanwhile.
    env = dict(os.environ, PARTITION_LEDGER=str(path), PARTITION_STEP_S="6.0")
    command = ns.command(*_app([sys.executable], _inside(postgres_url, ns)))
    with _pool(command, env, stderr, lease_s=8.0, heartbeat_s=HEARTBEAT_S, concurrency=2) as proc:
        _wait(lambda: len(_ledger(path)) == 2, "both workers busy", proc, stderr)
        # Cut just before short-0's next beat: its lease then has 6 s left at most, and the
        # beat sent into the cut waits in TCP retransmission (next tries 3 s and 6.2 s
        # after it) unless the worker gives it up and tries a fresh connection.
        extended = store.get_task("short-0").lease_expires
        _wait(lambda: store.get_task("short-0").lease_expires != extended, "no beat", proc, stderr)
        time.sleep(HEARTBEAT_S - 0.2)
        ns.cut()
        time.sleep(SHORT_CUT_S)
        ns.restore()
        _wait(_all_ended(store, ids), "the tasks did not finish after the link returned", proc, stderr)
        report = _stop(proc, stderr)
    _check_nothing_lost_or_twice(store, ids)
    runs = Counter(_ledger(path))
    assert set(runs.values()) == {1}, runs  # no lease lost: no body ran again
    for task_id in ids:
        history = store.history(task_id)
        assert not [e for e in history if e.detail.get("from_state") == "leased" or e.kind == "lease_lost"]
    assert report["restarts"] == 0, report


@pytest.mark.timeout(300)
def test_a_partition_several_leases_long_loses_leases_but_fails_no_task_as_a_crash(
    ns: Namespace, postgres_url: str, tmp_path: Path
) -> None:
    store = open_store(postgres_url)
    ids = [f"long-{n}" for n in range(4)]
    _enqueue(store, ids)
    path, stderr = tmp_path / "ledger.txt", tmp_path / "pool.err"
    env = dict(os.environ, PARTITION_LEDGER=str(path), PARTITION_STEP_S="1.0")
    command = ns.command(*_app([sys.executable], _inside(postgres_url, ns)))
    # One claim without progress allowed: a lost lease counted as a crash fails the task.
    with _pool(command, env, stderr, lease_s=4.0, heartbeat_s=1.0, concurrency=2, max_attempts=1) as proc:
        _wait(lambda: len({task for task, _ in _ledger(path)}) >= 2, "both workers busy", proc, stderr)
        time.sleep(0.5)
        ns.cut()
        time.sleep(15.0)
        ns.restore()
        restored = time.monotonic()
        _wait(_all_ended(store, ids), "the tasks did not finish after the link returned", proc, stderr)
        ended_s = time.monotonic() - restored
        report = _stop(proc, stderr)
    for task_id in ids:
        record = store.get_task(task_id)
        assert "crashing its worker" not in (record.reason or ""), record.reason
    _check_nothing_lost_or_twice(store, ids)
    runs = Counter(_ledger(path))
    assert max(runs.values()) <= 2, runs  # a step body in flight at the cut ran again, once
    lost = [(t, e.worker_id) for t in ids for e in store.history(t) if e.kind == "lease_lost"]
    assert lost, "the leases lost in the partition were not reported by the workers that lived"
    assert ended_s < 30, ended_s
    assert report["restarts"] == 0, report


@pytest.mark.timeout(300)
def test_a_worker_cut_off_in_a_non_idempotent_effect_leaves_it_to_be_reconciled(
    ns: Namespace, postgres_url: str, tmp_path: Path
) -> None:
    store = open_store(postgres_url)
    store.enqueue(WorkflowTask.new("partition-charge", 1, "order-1", checkpoint_id="c1"))
    path, gate, stderr = tmp_path / "ledger.txt", tmp_path / "gate", tmp_path / "pool.err"
    env = dict(os.environ, PARTITION_LEDGER=str(path), PARTITION_GATE=str(gate))
    inside = ns.command(*_app([sys.executable], _inside(postgres_url, ns)))
    outside = _app([sys.executable], postgres_url)
    leases = {"lease_s": 4.0, "heartbeat_s": 1.0, "concurrency": 1}
    with _pool(inside, env, stderr, **leases) as cut_off:
        _wait(lambda: ("c1", "charge#1") in _ledger(path), "the effect never started", cut_off, stderr)
        ns.cut()
        with _pool(outside, env, stderr, **leases, base_id="rescuer") as rescuer:
            # The rescuer takes the task over once the cut off worker's lease runs out,
            # finds the effect's intent without a result, and fails it closed.
            _wait(
                lambda: store.get_task("c1").state is TaskState.TERMINAL, "never taken over", rescuer, stderr
            )
            record = store.get_task("c1")
            assert (record.outcome, record.ambiguous_effect) == (TaskOutcome.FAILED, "c1/charge#1"), (
                record.reason
            )
            assert "crashing its worker" not in (record.reason or "")
            gate.touch()  # the cut off worker's effect body returns; its result cannot be stored
            time.sleep(1.0)
            ns.restore()
            time.sleep(3.0)  # the cut off worker reaches the store again; its late write is refused
            assert store.get_task("c1").ambiguous_effect == "c1/charge#1"
            store.resolve_effect(
                "c1", "c1/charge#1", applied=True, result_json='"charged"', actor="ops", reason="seen"
            )
            _wait(
                lambda: store.get_task("c1").state is TaskState.TERMINAL, "never completed", rescuer, stderr
            )
            # The cut off pool takes work again now that the link is back.
            store.enqueue(WorkflowTask.new("partition-flow", 1, 0, checkpoint_id="after"))
            _wait(_all_ended(store, ["after"]), "no work taken after the link returned", rescuer, stderr)
            _stop(rescuer, stderr)
        _stop(cut_off, stderr)
    record = store.get_task("c1")
    assert (record.state, record.outcome, record.result) == (
        TaskState.TERMINAL,
        TaskOutcome.COMPLETED,
        "charged",
    )
    runs = Counter(call for task, call in _ledger(path) if task == "c1")
    assert runs == {"prepare#1": 1, "charge#1": 1, "finish#1": 1}, runs  # the effect ran once in all
    assert [e.kind for e in store.history("c1")].count("completed") == 1


@pytest.mark.timeout(240)
def test_an_effect_result_whose_answer_is_lost_is_found_applied_and_not_run_again(
    ns: Namespace, postgres_url: str, tmp_path: Path
) -> None:
    """The commit recording a non-idempotent effect's result reaches the server and is
    applied, but its answer never comes back: the worker gives the attempt up and sends
    the commit again on a fresh connection, the fence refuses that one (the revision has
    moved on), and the row shows the first attempt applied under this lease. So the
    worker carries on with its task: no lease lost, no body run again, nothing to
    reconcile."""
    store = open_store(postgres_url)
    store.enqueue(WorkflowTask.new("partition-charge", 1, "order-2", checkpoint_id="c2"))
    path, gate, stderr = tmp_path / "ledger.txt", tmp_path / "gate", tmp_path / "pool.err"
    env = dict(os.environ, PARTITION_LEDGER=str(path), PARTITION_GATE=str(gate))
    command = ns.command(*_app([sys.executable], _inside(postgres_url, ns)))
    # Each attempt may take half a lease (6 s): answers stay away for 7 s, within the lease.
    with _pool(command, env, stderr, lease_s=12.0, heartbeat_s=3.0, concurrency=1) as proc:
        _wait(lambda: ("c2", "charge#1") in _ledger(path), "the effect never started", proc, stderr)
        ns.drop_replies()
        gate.touch()
        time.sleep(7.0)
        ns.restore()
        _wait(lambda: store.get_task("c2").state is TaskState.TERMINAL, "the task never ended", proc, stderr)
        report = _stop(proc, stderr)
    record = store.get_task("c2")
    assert (record.outcome, record.result) == (TaskOutcome.COMPLETED, "charged c2/charge#1"), record.reason
    assert Counter(call for _, call in _ledger(path)) == {"prepare#1": 1, "charge#1": 1, "finish#1": 1}
    history = store.history("c2")
    assert [e.kind for e in history].count("claimed") == 1, [e.kind for e in history]
    assert report["restarts"] == 0, report
