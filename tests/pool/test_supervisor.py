"""The forked pool under real signals: draining (on SQLite and PostgreSQL), graceful
SIGTERM, a child killed mid-step being replaced, and idle children waiting for work."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask, WorkflowWorker, open_store
from runifold_sync.errors import InvalidArgument
from runifold_sync.model.cancellation import CancellationToken
from runifold_sync.pool.supervisor import WorkflowSupervisor, WorkflowSupervisorConfig
from runifold_sync.store import TaskState
from tests.support import processes
from tests.support.backends import Backend

from . import pool_app


def _enqueue(store: WorkflowStore, count: int, *, prefix: str = "t") -> list[str]:
    ids = [f"{prefix}{n:04d}" for n in range(count)]
    for n, task_id in enumerate(ids):
        store.enqueue(WorkflowTask.new("pool-flow", 1, n, checkpoint_id=task_id))
    return ids


def _states(store: WorkflowStore, ids: list[str]) -> Counter[str]:
    return Counter(store.get_task(t).state.value for t in ids)


def _ledger(path: Path) -> list[tuple[str, str, int]]:
    return [(line.task_id, line.call_id, line.pid) for line in pool_app.read_ledger(path)]


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.txt"
    monkeypatch.setenv("POOL_LEDGER", str(path))
    return path


@pytest.fixture
def pool(ledger: Path) -> Iterator[list[subprocess.Popen[str]]]:
    with processes.reaped() as started:
        yield started


def _start_pool(
    pool: list[subprocess.Popen[str]],
    url: str,
    *,
    lease_s: float,
    grace_s: float,
    concurrency: int = 4,
    backoff_s: tuple[float, float] = (0.01, 0.1),
) -> subprocess.Popen[str]:
    proc = pool_app.spawn(url, lease_s=lease_s, grace_s=grace_s, concurrency=concurrency, backoff_s=backoff_s)
    pool.append(proc)
    return proc


def test_config_rejects_bad_concurrency_backoff_and_shutdown_grace() -> None:
    with pytest.raises(InvalidArgument, match="concurrency must be an integer >= 1, got 0"):
        WorkflowSupervisorConfig(0)
    with pytest.raises(InvalidArgument, match="min_backoff 2 s is above max_backoff 1 s"):
        WorkflowSupervisorConfig(2).with_backoff(timedelta(seconds=2), timedelta(seconds=1))
    with pytest.raises(
        InvalidArgument, match=r"shutdown_grace must be positive, got datetime.timedelta\(0\)"
    ):
        WorkflowSupervisorConfig(2).with_shutdown_grace(timedelta(0))
    with pytest.raises(InvalidArgument, match="shutdown_grace must be a datetime.timedelta, got 30"):
        WorkflowSupervisorConfig(2).with_shutdown_grace(30)  # type: ignore[arg-type]
    assert WorkflowSupervisorConfig(2).with_shutdown_grace(timedelta(seconds=1)).shutdown_grace == timedelta(
        seconds=1
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["sqlite", "postgres", "pgbouncer"], indirect=True)
def test_four_processes_drain_300_five_step_tasks(backend: Backend, ledger: Path) -> None:
    """On each store, PostgreSQL through PgBouncer in transaction mode included."""
    store = backend.open()
    ids = _enqueue(store, 300)
    # The supervisor forks this (pytest) process. A thread that is inside SQLite or libpq
    # at that moment (a store's pool threads, a watcher polling the store) can leave one
    # of their locks held forever in a child, which then hangs; so no store is open here
    # while the pool runs, and the watcher reads only the ledger file.
    store.close()
    lease = LeaseDuration(timedelta(seconds=10))

    def factory(worker_id: WorkerId) -> WorkflowWorker:  # runs in the child, after the fork
        return WorkflowWorker(
            open_store(backend.url), pool_app.registry(), worker_id, lease, timedelta(seconds=2)
        )

    token = CancellationToken()
    config = WorkflowSupervisorConfig(4).with_backoff(timedelta(milliseconds=10), timedelta(milliseconds=100))

    def stop_when_every_last_step_started() -> None:
        # Cancelling then is enough: a child finishes its started cycle (the whole task).
        deadline = time.monotonic() + 100
        while time.monotonic() < deadline and len(_ledger(ledger)) < 300 * pool_app.STEPS:
            time.sleep(0.05)
        token.cancel()

    watcher = threading.Thread(target=stop_when_every_last_step_started)
    watcher.start()
    report = WorkflowSupervisor(factory, config, base_id="drain").run(token)
    watcher.join()

    assert report.outcomes["completed"] == 300
    assert set(report.per_worker) == {f"drain-{n}" for n in range(4)}
    assert report.restarts == 0
    store = backend.open()
    assert _states(store, ids) == {"terminal": 300}
    assert all(store.get_task(t).result == n + pool_app.STEPS for n, t in enumerate(ids))
    runs = Counter((t, c) for t, c, _pid in _ledger(ledger))
    assert len(runs) == 300 * pool_app.STEPS and set(runs.values()) == {1}
    # Four forked workers ran the steps; none ran in this (the supervisor's) process.
    pids = {pid for _t, _c, pid in _ledger(ledger)}
    assert len(pids) == 4 and os.getpid() not in pids


@pytest.mark.timeout(90)
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stop_signal_ends_pool_within_lease_plus_grace_and_leaves_no_task_leased(
    backend: Backend,
    ledger: Path,
    pool: list[subprocess.Popen[str]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    stop: signal.Signals,
) -> None:
    """SIGTERM (a service manager, to the supervisor) and SIGINT (Ctrl-C in a terminal,
    which signals the whole foreground process group: supervisor and children) both stop
    new claims and let every started cycle finish its lease protocol."""
    monkeypatch.setenv("POOL_STEP_SECONDS", "0.3")
    store = backend.open()
    ids = _enqueue(store, 40)
    lease_s, grace_s = 2.0, 10.0
    stderr_path = tmp_path / "pool.stderr"
    with stderr_path.open("w") as stderr:
        proc = pool_app.spawn(backend.url, lease_s=lease_s, grace_s=grace_s, stderr=stderr)
    pool.append(proc)
    deadline = time.monotonic() + 30
    while len(_ledger(ledger)) < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _states(store, ids)["leased"] >= 1, "steps should be in flight when the signal arrives"
    # Forked children stay in the supervisor's process group, so killpg reaches them too.
    assert {os.getpgid(pid) for _t, _c, pid in _ledger(ledger)} == {proc.pid}

    stopped_at = time.monotonic()
    if stop is signal.SIGINT:
        os.killpg(proc.pid, stop)  # the pool runs in its own session: its own group
    else:
        proc.send_signal(stop)
    out, _ = proc.communicate(timeout=lease_s + grace_s + 5)
    elapsed = time.monotonic() - stopped_at

    assert proc.returncode == 0
    assert elapsed < lease_s + grace_s
    # No child died of the signal (a crash is logged with a traceback) or was killed
    # for overrunning the grace.
    assert stderr_path.read_text() == ""
    assert json.loads(out)["outcomes"]["completed"] >= 1
    # Every started cycle ended with its lease protocol: nothing is left leased.
    states = _states(store, ids)
    assert states["leased"] == 0
    assert states["terminal"] + states["queued"] == len(ids)


@pytest.mark.timeout(90)
def test_sigterm_during_running_cycles_makes_no_claim_after_the_signal(
    backend: Backend, ledger: Path, pool: list[subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shutdown stops new claims (DESIGN 9): a child whose task is mid-step when SIGTERM
    arrives completes that task, but the completion claims no next task with it (which
    ``close()`` would only hand back). The signal lands while every child is inside a
    step body, so each completion comes after it."""
    monkeypatch.setenv("POOL_STEP_SECONDS", "0.3")
    store = backend.open()
    ids = _enqueue(store, 40)
    proc = _start_pool(pool, backend.url, lease_s=2.0, grace_s=10.0)
    deadline = time.monotonic() + 30
    while len(_ledger(ledger)) < 8 and time.monotonic() < deadline:
        time.sleep(0.02)
    started = {t for t, _c, _pid in _ledger(ledger)}
    signalled_at = store.now()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)

    assert proc.returncode == 0
    events = [e for t in ids for e in store.history(t)]
    late_claims = [
        (e.task_id, e.worker_id, e.at) for e in events if e.kind == "claimed" and e.at > signalled_at
    ]
    assert late_claims == []
    # The cycles running at the signal finished; every other task is untouched.
    assert all(store.get_task(t).state is TaskState.TERMINAL for t in started)
    states = _states(store, ids)
    assert states["terminal"] == json.loads(out)["outcomes"]["completed"] >= len(started)
    assert states["terminal"] + states["queued"] == len(ids)


@pytest.mark.timeout(120)
def test_children_overrunning_the_shutdown_grace_are_killed_and_their_tasks_complete_after_lease_expiry(
    backend: Backend,
    ledger: Path,
    pool: list[subprocess.Popen[str]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A 5 s step outlasts a 1 s shutdown grace: the supervisor SIGKILLs the children at
    the end of the grace and exits, and the tasks they held are claimed again (by a new
    pool) once their leases expire, their interrupted first step running again."""
    monkeypatch.setenv("POOL_STEP_SECONDS", "5")
    store = backend.open()
    ids = _enqueue(store, 2)
    lease_s, grace_s = 2.0, 1.0
    with (tmp_path / "pool.stderr").open("w") as stderr:
        proc = pool_app.spawn(backend.url, lease_s=lease_s, grace_s=grace_s, concurrency=2, stderr=stderr)
    pool.append(proc)
    deadline = time.monotonic() + 30
    while len(_ledger(ledger)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    children = {pid for _t, _c, pid in _ledger(ledger)}
    assert len(children) == 2, "both children should be inside their first step"

    stopped_at = time.monotonic()
    signalled_at = store.now()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    elapsed = time.monotonic() - stopped_at

    print(f"pool with a {grace_s} s grace stopped {elapsed:.3f} s after SIGTERM")
    assert proc.returncode == 0
    assert grace_s <= elapsed < grace_s + 3.0
    assert json.loads(out)["outcomes"] == {}  # no cycle finished
    for pid in children:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed, and reaped by the supervisor
    log = (tmp_path / "pool.stderr").read_text()
    for slot in (0, 1):
        assert f"worker pool-{slot} did not stop within the shutdown grace of 1 s; killing it" in log
    assert _states(store, ids) == {"leased": 2}  # held by dead workers until the leases expire

    monkeypatch.setenv("POOL_STEP_SECONDS", "0")
    second = _start_pool(pool, backend.url, lease_s=lease_s, grace_s=10.0, concurrency=2)
    for task_id in ids:
        _wait_terminal(store, task_id)
    second.send_signal(signal.SIGTERM)
    second.communicate(timeout=30)
    for n, task_id in enumerate(ids):
        assert store.get_task(task_id).result == n + pool_app.STEPS
        takeover = [
            e for e in store.history(task_id) if e.kind == "claimed" and e.detail.get("expired_owner")
        ]
        assert len(takeover) == 1 and takeover[0].at >= signalled_at + timedelta(seconds=grace_s)
        first_steps = [pid for t, c, pid in _ledger(ledger) if t == task_id and c == "work#1"]
        assert len(first_steps) == 2 and first_steps[0] in children and first_steps[1] not in children


# A lease long enough that its expiry cannot explain a takeover within the test's bound.
KILL_LEASE_S = 30.0
TAKEOVER_LIMIT_S = 5.0  # the benchmark's p50 is far lower (benchmarks/recovery.py)


@pytest.mark.timeout(120)
def test_child_killed_mid_step_has_its_task_handed_back_at_once_and_a_new_incarnation_in_its_slot(
    backend: Backend, ledger: Path, pool: list[subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor reaps a SIGKILLed child at once, and the child it forks in the slot
    hands the dead one's lease back (fenced by its token) before it claims anything: the
    task is claimed again within seconds, not once its 30 s lease runs out. The new child
    works under an id of its own (``pool-N.1``), so the registry, the history and ``show``
    never take the dead worker for a live one."""
    monkeypatch.setenv("POOL_STEP_SECONDS", "0.2")
    store = backend.open()
    # One task per child: the task handed back waits behind no queue (the claim takes it
    # in its ready time's turn, which the hand-back sets to now).
    ids = _enqueue(store, 4)
    proc = _start_pool(pool, backend.url, lease_s=KILL_LEASE_S, grace_s=10.0)
    deadline = time.monotonic() + 30
    while not _ledger(ledger) and time.monotonic() < deadline:
        time.sleep(0.02)
    victim_task, _victim_call, victim_pid = _ledger(ledger)[0]
    victim_id = store.get_task(victim_task).worker_id
    assert victim_id is not None
    os.kill(victim_pid, signal.SIGKILL)
    killed_at = store.now()

    def taken_over() -> bool:
        return any(e.kind == "claimed" and e.at > killed_at for e in store.history(victim_task))

    processes.wait_until(taken_over, KILL_LEASE_S, "the victim's task claimed again")
    takeover = next(e for e in store.history(victim_task) if e.kind == "claimed" and e.at > killed_at)
    took_s = (takeover.at - killed_at).total_seconds()
    print(f"SIGKILL -> next claim of its task: {took_s:.3f} s (lease {KILL_LEASE_S:.0f} s)")
    assert took_s < TAKEOVER_LIMIT_S
    handed = [e for e in store.history(victim_task) if e.kind == "handed_back"]
    assert [(e.worker_id, e.at <= takeover.at) for e in handed] == [(victim_id, True)]
    assert f"worker {victim_id} (pid {victim_pid}) was killed by SIGKILL" in handed[0].detail["reason"]
    assert takeover.detail == {"from_state": "leased", "expired_owner": victim_id}
    assert takeover.worker_id != victim_id

    # The registry: the dead worker stopped, a new incarnation live in its slot.
    successor = f"{victim_id}.1"
    processes.wait_until(lambda: any(w.worker_id == successor for w in store.workers()), 30, "the successor")
    workers = {w.worker_id: w for w in store.workers()}
    assert workers[victim_id].stopped_at is not None and workers[victim_id].pid == victim_pid
    assert workers[successor].live(timedelta(seconds=30)) and workers[successor].pid != victim_pid

    deadline = time.monotonic() + 60
    while _states(store, ids)["terminal"] < len(ids) and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)

    assert _states(store, ids)["terminal"] == len(ids)
    assert all(store.get_task(t).result == n + pool_app.STEPS for n, t in enumerate(ids))
    report = json.loads(out)
    assert report["restarts"] == 1
    assert set(report["per_worker"]) <= {f"pool-{n}" for n in range(4)} | {successor}
    # Nothing was claimed under the dead worker's id after the kill.
    claims = [e for t in ids for e in store.history(t) if e.kind == "claimed" and e.at > killed_at]
    assert claims and all(e.worker_id != victim_id for e in claims)


def _wait_terminal(store: WorkflowStore, task_id: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while store.get_task(task_id).state is not TaskState.TERMINAL:
        assert time.monotonic() < deadline, f"task {task_id} did not finish"
        time.sleep(0.02)


def _first_step_at(ledger: Path, task_id: str, timeout_s: float = 15.0) -> float:
    """Wall time at which the task's first step body started."""
    deadline = time.monotonic() + timeout_s
    while True:
        started = [line.at for line in pool_app.read_ledger(ledger) if line.task_id == task_id]
        if started:
            return started[0]
        assert time.monotonic() < deadline, f"task {task_id} was not started"
        time.sleep(0.005)


IDLE_BACKOFF_S = (5.0, 5.0)  # every idle wait is 5 s: an earlier wake-up can only come from the store


@pytest.mark.timeout(90)
def test_idle_pool_on_postgres_starts_a_new_task_at_once_instead_of_after_its_backoff(
    postgres_url: str, ledger: Path, pool: list[subprocess.Popen[str]]
) -> None:
    """Idle children block in ``wait_for_work`` (LISTEN), so an enqueue's NOTIFY wakes
    one of them; sleeping through the backoff instead would give a median delay of
    seconds here. Measured from just before ``enqueue`` to the first step's ledger line."""
    store = open_store(postgres_url)
    _start_pool(pool, postgres_url, lease_s=2.0, grace_s=10.0, concurrency=2, backoff_s=IDLE_BACKOFF_S)
    [warm_up] = _enqueue(store, 1, prefix="warm")
    _wait_terminal(store, warm_up)  # the pool is up; from here on both children are idle
    delays = []
    for n in range(10):
        time.sleep(0.2 + 0.1 * (n % 4))  # different phases of the children's waits
        enqueued_at = time.time()
        [task_id] = _enqueue(store, 1, prefix=f"idle{n}-")
        delays.append(_first_step_at(ledger, task_id) - enqueued_at)
        _wait_terminal(store, task_id)
    store.close()
    delays.sort()
    print(f"enqueue -> first step delays (s): {[round(d, 3) for d in delays]}")
    assert statistics.median(delays) < 0.5, delays


@pytest.mark.timeout(90)
def test_idle_pool_on_postgres_starts_work_that_came_without_a_notify_within_a_wait_slice(
    postgres_url: str, ledger: Path, pool: list[subprocess.Popen[str]]
) -> None:
    """NOTIFY is the fast path, polling the fallback: a task inserted by raw SQL (no
    NOTIFY, as when a notification is lost) is found when a child's next ``wait_for_work``
    slice (0.5 s) looks for due work, not after its 5 s backoff. Measured from just before
    the INSERT to the first step's ledger line."""
    store = open_store(postgres_url)
    _start_pool(pool, postgres_url, lease_s=2.0, grace_s=10.0, concurrency=2, backoff_s=IDLE_BACKOFF_S)
    [warm_up] = _enqueue(store, 1, prefix="warm")
    _wait_terminal(store, warm_up)
    delays = []
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("LISTEN runifold_tasks")  # to show that nothing notified
        for n in range(5):
            time.sleep(0.2 + 0.1 * (n % 4))
            task_id = f"silent{n}"
            inserted_at = time.time()
            conn.execute(
                "INSERT INTO runifold_tasks (task_id, definition_name, definition_version, tenant, input, "
                "input_text, state, ready_at, created_at, updated_at) VALUES (%s, 'pool-flow', 1, "
                "'default', '1', '1', 'queued', clock_timestamp(), clock_timestamp(), clock_timestamp())",
                (task_id,),
            )
            delays.append(_first_step_at(ledger, task_id) - inserted_at)
            _wait_terminal(store, task_id)
        assert list(conn.notifies(timeout=0.2)) == []
    store.close()
    print(f"insert without NOTIFY -> first step delays (s): {[round(d, 3) for d in delays]}")
    assert max(delays) < 2.5, delays  # a wake-up only at the end of the backoff takes 5 s


@pytest.mark.timeout(60)
def test_sigterm_stops_an_idle_pool_within_a_wait_slice_not_its_backoff(
    backend: Backend, ledger: Path, pool: list[subprocess.Popen[str]]
) -> None:
    """Children idle in 5 s waits stop within about one ``wait_for_work`` slice (0.5 s).
    The warmed-up child starts its slices as the task completes, so the signal sent 0.5 s
    later arrives just after a slice began: close to the worst case."""
    store = backend.open()
    proc = _start_pool(pool, backend.url, lease_s=2.0, grace_s=10.0, concurrency=2, backoff_s=IDLE_BACKOFF_S)
    [warm_up] = _enqueue(store, 1, prefix="warm")
    _wait_terminal(store, warm_up)
    time.sleep(0.5)  # both children are in an idle wait now
    stopped_at = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    elapsed = time.monotonic() - stopped_at
    print(f"idle pool stopped {elapsed:.3f} s after SIGTERM")
    assert proc.returncode == 0
    assert json.loads(out)["outcomes"]["completed"] == 1
    assert elapsed < 2.5


@pytest.mark.timeout(60)
def test_a_slot_whose_worker_dies_at_start_is_respawned_with_growing_delay() -> None:
    def factory(worker_id: WorkerId) -> WorkflowWorker:
        raise RuntimeError("store unreachable")  # every child dies while starting

    config = WorkflowSupervisorConfig(1).with_backoff(timedelta(milliseconds=10), timedelta(seconds=1))
    supervisor = WorkflowSupervisor(factory, config, base_id="crashy")
    token = CancellationToken()
    stop = threading.Timer(2.5, token.cancel)
    stop.start()
    report = supervisor.run(token)
    stop.join()
    # Delays 0, 0.1, 0.2, 0.4, 0.8 s...: about five restarts in 2.5 s, not hundreds.
    assert 3 <= report.restarts <= 8
