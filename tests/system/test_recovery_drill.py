"""The recovery drill of the seed, run against a real store (a SQLite file, and a fresh
PostgreSQL database: every test runs on both) with real worker processes that are killed
(SIGKILL) or frozen (SIGSTOP/SIGCONT) in the middle of a step.

Nothing is mocked. Each worker is ``python -m tests.system.drill_app`` in its own
process; what its step bodies really ran is read from a ledger file they fsync, and what
it reported from the JSON outcome lines it prints. Lease expiry is always store time:
real time passing in the two takeover drills, the store's shared clock offset elsewhere.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest

from runifold_sync import BudgetUsage, LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.model import crashpoints
from runifold_sync.model.codec import from_json
from runifold_sync.store import TaskOutcome, TaskState
from runifold_sync.store.open import sqlite_path
from tests.support import ledger, processes
from tests.support.backends import Backend
from tests.support.clock import Clock
from tests.support.journals import entries
from tests.system import drill_app

LEASE_S = 2.0
HEARTBEAT_S = 0.5
PROCESS_TIMEOUT_S = 20.0


class Drill:
    """One database, one ledger and the worker processes started against them."""

    def __init__(self, tmp_path: Path, backend: Backend) -> None:
        self.tmp_path = tmp_path
        self.backend = backend
        self.ledger = tmp_path / "ledger.txt"
        self.store = backend.open()
        self.clock = Clock(self.store)
        self.procs: list[subprocess.Popen[str]] = []
        self.names: dict[int, str] = {}  # pid -> worker id, which also names its output files

    # --- worker processes ----------------------------------------------------------

    def start(
        self,
        worker_id: str,
        *,
        registry: str = "v1",
        block_at: str | None = None,
        until_idle: bool = False,
        pause_at: str | None = None,
    ) -> subprocess.Popen[str]:
        """Start a worker; ``pause_at`` (a crash point spec) pauses it there until :meth:`resume`."""
        args = [
            "--url",
            self.backend.url,
            "--worker-id",
            worker_id,
            "--ledger",
            str(self.ledger),
            "--lease-s",
            str(LEASE_S),
            "--heartbeat-s",
            str(HEARTBEAT_S),
            "--registry",
            registry,
        ]
        if block_at is not None:
            args += ["--block-at", block_at]
        if until_idle:
            args.append("--until-idle")
        env = dict(os.environ)
        if pause_at is not None:
            env[crashpoints.ENV_VAR] = pause_at
            env[crashpoints.PAUSE_ENV_VAR] = str(self._resume_file(worker_id))
        with (
            open(self.tmp_path / f"{worker_id}.out", "wb") as out,
            open(self.tmp_path / f"{worker_id}.err", "wb") as err,
        ):
            proc = processes.spawn("tests.system.drill_app", *args, stdout=out, stderr=err, env=env)
        self.procs.append(proc)
        self.names[proc.pid] = worker_id
        return proc

    def stderr(self, proc: subprocess.Popen[str]) -> str:
        return (self.tmp_path / f"{self.names[proc.pid]}.err").read_text()

    def _resume_file(self, worker_id: str) -> Path:
        return self.tmp_path / f"{worker_id}.resume"

    def wait_for_stderr(self, proc: subprocess.Popen[str], text: str) -> None:
        """Wait until ``proc`` has written ``text`` to its stderr (a crash point's line)."""
        deadline = time.monotonic() + PROCESS_TIMEOUT_S
        while text not in self.stderr(proc):
            if proc.poll() is not None:
                pytest.fail(f"worker {self.names[proc.pid]} exited {proc.returncode}: {self.stderr(proc)}")
            if time.monotonic() > deadline:
                pytest.fail(f"worker {self.names[proc.pid]} never wrote {text!r}: {self.stderr(proc)}")
            time.sleep(0.02)

    def resume(self, proc: subprocess.Popen[str]) -> None:
        """Let a worker paused at its crash point go on, and wake it if it is stopped."""
        self._resume_file(self.names[proc.pid]).touch()
        os.kill(proc.pid, signal.SIGCONT)

    def finish(self, proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
        """Wait for a worker that must exit normally; its outcomes, one per run_once."""
        returncode = proc.wait(PROCESS_TIMEOUT_S)
        assert returncode == 0, f"worker {self.names[proc.pid]} exited {returncode}: {self.stderr(proc)}"
        text = (self.tmp_path / f"{self.names[proc.pid]}.out").read_text()
        return [json.loads(line) for line in text.splitlines()]

    def run(self, worker_id: str, **options: Any) -> list[dict[str, Any]]:
        return self.finish(self.start(worker_id, **options))

    def kill(self, proc: subprocess.Popen[str]) -> None:
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(PROCESS_TIMEOUT_S) == -signal.SIGKILL

    def stop_outside_transaction(self, proc: subprocess.Popen[str]) -> None:
        """SIGSTOP ``proc`` at a moment its heartbeat thread holds no SQLite write lock.

        A process frozen inside a write transaction would block every other writer of the
        database file until the busy timeout; that is SQLite's single-writer lock, not the
        lease protocol under test, so the freeze is retried until it lands between writes.
        PostgreSQL needs no such care: a heartbeat is one autocommit statement, and the
        server finishes it (and releases its row lock) whether or not the client is frozen.
        """
        if self.backend.name != "sqlite":
            processes.stop(proc.pid)
            return
        for _ in range(100):
            processes.stop(proc.pid)
            if not self._write_locked():
                return
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.01)
        pytest.fail(f"worker {self.names[proc.pid]} always held the database write lock when stopped")

    def _write_locked(self) -> bool:
        conn = sqlite3.connect(sqlite_path(self.backend.url), timeout=0, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return False
        except sqlite3.OperationalError:
            return True
        finally:
            conn.close()

    def close(self) -> None:
        try:
            for proc in self.procs:
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGCONT)  # a stopped process still dies, but be plain
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(PROCESS_TIMEOUT_S)
        finally:
            self.backend.close_all()

    # --- ledger --------------------------------------------------------------------

    def ledger_lines(self, task_id: str) -> list[tuple[str, int]]:
        """(step id, pid) of every step body that started for ``task_id``, in order."""
        lines = []
        for step_id, line_task, pid in ledger.read(self.ledger):
            if line_task == task_id:
                lines.append((step_id, int(pid)))
        return lines

    def wait_for_step(self, step_id: str, task_id: str, proc: subprocess.Popen[str]) -> None:
        """Wait until ``proc`` is inside ``step_id``: its ledger line is written first."""
        deadline = time.monotonic() + PROCESS_TIMEOUT_S
        while (step_id, proc.pid) not in self.ledger_lines(task_id):
            if proc.poll() is not None:
                name = self.names[proc.pid]
                pytest.fail(f"worker {name} exited {proc.returncode} before {step_id}: {self.stderr(proc)}")
            if time.monotonic() > deadline:
                pytest.fail(f"worker {self.names[proc.pid]} never reached step {step_id}")
            time.sleep(0.02)

    def release(self, proc: subprocess.Popen[str]) -> None:
        """Let ``proc``'s blocked step return."""
        Path(f"{self.ledger}.release.{self.names[proc.pid]}").touch()

    def assert_lease_held_against_claims(self, task_id: str) -> None:
        """A claim while the task's lease is unexpired in store time gets nothing."""
        expires = self.store.get_task(task_id).lease_expires
        assert expires is not None and self.store.now() < expires
        lease = LeaseDuration(timedelta(seconds=LEASE_S))
        assert self.store.claim(WorkerId.parse("early-claimer"), lease) == []

    # --- store time ----------------------------------------------------------------

    def wait_past_lease(self, task_id: str) -> None:
        """Let real time pass until the task's lease has expired in store time."""
        expires = self.store.get_task(task_id).lease_expires
        assert expires is not None
        deadline = time.monotonic() + LEASE_S + PROCESS_TIMEOUT_S
        while self.store.now() <= expires:
            assert time.monotonic() < deadline, "store time never passed the lease expiry"
            time.sleep(0.05)

    def advance_clock(self, delta: timedelta) -> None:
        """Move store time forward for every process on the database."""
        self.clock.advance(delta)

    def advance_past_lease(self, task_id: str) -> None:
        expires = self.store.get_task(task_id).lease_expires
        assert expires is not None
        self.advance_clock(expires - self.store.now() + timedelta(seconds=0.5))
        assert self.store.now() > expires


def _usage(checkpoint_json: str | None) -> BudgetUsage:
    assert checkpoint_json is not None
    return BudgetUsage(**from_json(checkpoint_json)["usage"])


def _journal(store: WorkflowStore, task_id: str) -> dict[str, dict[str, Any]]:
    return {entry["call_id"]: entry for entry in entries(store, task_id)}


@pytest.fixture
def drill(tmp_path: Path, backend: Backend) -> Iterator[Drill]:
    harness = Drill(tmp_path, backend)
    try:
        yield harness
    finally:
        harness.close()


@pytest.mark.timeout(60)
def test_worker_killed_mid_step_is_continued_by_new_worker_without_repeating_completed_steps(
    drill: Drill,
) -> None:
    enqueued = drill.store.enqueue(WorkflowTask.new("drill", 1, 4, checkpoint_id="drill-1"))
    assert (enqueued.task_id, enqueued.created) == ("drill-1", True)
    again = drill.store.enqueue(WorkflowTask.new("drill", 1, 4, checkpoint_id="drill-1"))
    assert (again.task_id, again.created) == ("drill-1", False)  # idempotent on the identity

    a = drill.start("drill-a", block_at="s3")
    drill.wait_for_step("s3", "drill-1", a)
    before = drill.store.get_task("drill-1")
    assert (before.state, before.worker_id, before.revision) == (TaskState.LEASED, "drill-a", 2)
    usage_before = _usage(before.checkpoint_json)
    assert (usage_before.steps, usage_before.cost, usage_before.claims) == (2, 2.0, 1)

    drill.kill(a)
    drill.assert_lease_held_against_claims("drill-1")  # dead, but its lease still stands
    dead_lease_expires = drill.store.get_task("drill-1").lease_expires
    drill.wait_past_lease("drill-1")
    assert drill.clock.offset == timedelta(0)  # the lease expired in real time

    outcomes = drill.run("drill-b")
    assert [(o["kind"], o["task_id"], o["result"]) for o in outcomes] == [
        ("completed", "drill-1", {"value": ((4 + 1) * 10 + 3) * 2})
    ]
    b_pid = outcomes[0]["pid"]

    # s1 and s2 ran once (in A); s3 ran twice, once interrupted by the kill; s4 once.
    assert drill.ledger_lines("drill-1") == [
        ("s1", a.pid),
        ("s2", a.pid),
        ("s3", a.pid),
        ("s3", b_pid),
        ("s4", b_pid),
    ]

    after = drill.store.get_task("drill-1")
    assert (after.state, after.outcome) == (TaskState.TERMINAL, TaskOutcome.COMPLETED)
    usage_after = _usage(after.checkpoint_json)
    assert usage_after.covers(usage_before)
    assert (usage_after.steps, usage_after.cost, usage_after.claims) == (4, 4.0, 2)
    assert usage_after.elapsed_s >= usage_before.elapsed_s

    claims = [e for e in drill.store.history("drill-1") if e.kind == "claimed"]
    assert [(e.worker_id, e.fencing_token) for e in claims] == [("drill-a", 1), ("drill-b", 2)]
    assert claims[1].detail == {"from_state": "leased", "expired_owner": "drill-a"}
    assert dead_lease_expires is not None and claims[1].at > dead_lease_expires
    assert after.fencing_token == 2


@pytest.mark.timeout(60)
def test_interrupted_non_idempotent_effect_fails_closed_as_ambiguous_until_resolved_without_rerun(
    drill: Drill,
) -> None:
    drill.store.enqueue(WorkflowTask.new("payment", 1, "order-7", checkpoint_id="pay-1"))
    key = "pay-1/charge_card#1"

    a = drill.start("pay-a", block_at="charge_card")
    drill.wait_for_step("charge_card", "pay-1", a)
    intent = _journal(drill.store, "pay-1")["charge_card#1"]
    assert (intent["status"], intent["key"]) == ("intent", key)  # durable before the call
    drill.kill(a)
    drill.advance_past_lease("pay-1")

    [b] = drill.run("pay-b")
    assert (b["kind"], b["task_id"], b["recoverable"]) == ("failed", "pay-1", True)
    assert "'charge_card'" in b["reason"] and key in b["reason"]
    assert "outcome is unknown" in b["reason"]
    failed = drill.store.get_task("pay-1")
    assert (failed.state, failed.outcome) == (TaskState.TERMINAL, TaskOutcome.FAILED)
    assert (failed.ambiguous_effect, failed.reason) == (key, b["reason"])
    # The effect was not run again, and nothing after it ran.
    assert drill.ledger_lines("pay-1") == [("prepare", a.pid), ("charge_card", a.pid)]

    evidence = {"charge_id": "ch-psp-991", "key": key}
    drill.store.resolve_effect(
        "pay-1",
        key,
        applied=True,
        result_json=json.dumps(evidence),
        actor="ops",
        reason="PSP dashboard shows the charge",
    )
    assert drill.store.get_task("pay-1").state is TaskState.QUEUED

    [c] = drill.run("pay-c")
    assert (c["kind"], c["task_id"]) == ("completed", "pay-1")
    assert c["result"] == {"charge": evidence, "receipt": "receipt for ch-psp-991"}
    assert drill.ledger_lines("pay-1") == [
        ("prepare", a.pid),
        ("charge_card", a.pid),
        ("send_receipt", c["pid"]),
    ]
    done = drill.store.get_task("pay-1")
    assert (done.state, done.outcome, done.ambiguous_effect) == (
        TaskState.TERMINAL,
        TaskOutcome.COMPLETED,
        None,
    )
    entry = _journal(drill.store, done.task_id)["charge_card#1"]
    assert (entry["status"], entry["output"]) == ("done", evidence)
    assert entry["evidence"] == "resolved by ops: PSP dashboard shows the charge"
    resolutions = [e for e in drill.store.history("pay-1") if e.kind == "effect_resolved"]
    assert [e.detail for e in resolutions] == [
        {"effect_key": key, "applied": True, "actor": "ops", "reason": "PSP dashboard shows the charge"}
    ]


@pytest.mark.timeout(60)
def test_stopped_owner_resumed_after_takeover_reports_lease_lost_and_changes_nothing(
    drill: Drill,
) -> None:
    drill.store.enqueue(WorkflowTask.new("drill", 1, 1, checkpoint_id="stale-1"))
    a = drill.start("stale-a", block_at="s3")
    drill.wait_for_step("s3", "stale-1", a)
    drill.stop_outside_transaction(a)
    drill.assert_lease_held_against_claims("stale-1")
    drill.wait_past_lease("stale-1")  # real time: A's heartbeat thread is frozen too

    # B takes over and is inside s3 at the same revision A read, holding a live lease:
    # only the fencing token tells A's late writes from B's.
    b = drill.start("stale-b", block_at="s3")
    drill.wait_for_step("s3", "stale-1", b)
    taken = drill.store.get_task("stale-1")
    assert (taken.state, taken.worker_id, taken.fencing_token, taken.revision) == (
        TaskState.LEASED,
        "stale-b",
        2,
        2,
    )
    journal_at_takeover = entries(drill.store, "stale-1")
    history_at_takeover = drill.store.history("stale-1")
    claims = [e for e in history_at_takeover if e.kind == "claimed"]
    assert [(e.worker_id, e.fencing_token) for e in claims] == [("stale-a", 1), ("stale-b", 2)]

    drill.release(a)
    os.kill(a.pid, signal.SIGCONT)
    [a_outcome] = drill.finish(a)
    assert a_outcome.pop("operation") in ("next step", "checkpoint commit")  # whichever saw it first
    assert a_outcome == {"kind": "lease_lost", "task_id": "stale-1", "fencing_token": 1, "pid": a.pid}

    # Nothing A tried after waking was applied: the row is still B's, at B's revision.
    after_a = drill.store.get_task("stale-1")
    assert (after_a.state, after_a.worker_id, after_a.fencing_token) == (TaskState.LEASED, "stale-b", 2)
    assert (after_a.revision, after_a.checkpoint_json) == (taken.revision, taken.checkpoint_json)
    assert entries(drill.store, "stale-1") == journal_at_takeover
    assert drill.store.history("stale-1") == history_at_takeover

    drill.release(b)
    [b_outcome] = drill.finish(b)
    assert (b_outcome["kind"], b_outcome["result"]) == ("completed", {"value": ((1 + 1) * 10 + 3) * 2})
    done = drill.store.get_task("stale-1")
    assert (done.state, done.outcome) == (TaskState.TERMINAL, TaskOutcome.COMPLETED)
    assert done.revision == taken.revision + 2  # B's s3, then s4 with the completion
    b_claim_id = claims[1].event_id
    after_takeover = [e for e in drill.store.history("stale-1") if e.event_id > b_claim_id]
    assert [(e.kind, e.worker_id, e.fencing_token) for e in after_takeover] == [("completed", "stale-b", 2)]
    # A's s3 finished after SIGCONT, but its next step never ran.
    assert drill.ledger_lines("stale-1") == [
        ("s1", a.pid),
        ("s2", a.pid),
        ("s3", a.pid),
        ("s3", b.pid),
        ("s4", b.pid),
    ]


@pytest.mark.timeout(60)
def test_stale_owner_frozen_past_its_lease_check_has_its_commit_refused_by_the_store(drill: Drill) -> None:
    """A is frozen after its last local lease check (s3 ran, its lease was held), with
    the commit recording s3 about to be sent. B takes over at the revision A read, so
    when A wakes and sends that commit only the store's fencing token can refuse it."""
    drill.store.enqueue(WorkflowTask.new("drill", 1, 1, checkpoint_id="fenced-1"))
    a = drill.start("fenced-a", pause_at="before_commit:s3#1")
    drill.wait_for_stderr(a, f"runifold crash point before_commit:s3#1 paused in pid {a.pid}")
    paused = drill.store.get_task("fenced-1")
    assert (paused.state, paused.worker_id, paused.fencing_token, paused.revision) == (
        TaskState.LEASED,
        "fenced-a",
        1,
        2,
    )
    assert list(_journal(drill.store, "fenced-1")) == ["s1#1", "s2#1"]
    drill.stop_outside_transaction(a)
    drill.assert_lease_held_against_claims("fenced-1")
    drill.wait_past_lease("fenced-1")  # real time: A's heartbeat thread is frozen too

    b = drill.start("fenced-b", block_at="s3")
    drill.wait_for_step("s3", "fenced-1", b)
    taken = drill.store.get_task("fenced-1")
    assert (taken.state, taken.worker_id, taken.fencing_token, taken.revision) == (
        TaskState.LEASED,
        "fenced-b",
        2,
        paused.revision,
    )
    assert taken.checkpoint_json is not None
    journal_at_takeover = entries(drill.store, "fenced-1")
    history_at_takeover = drill.store.history("fenced-1")

    drill.resume(a)
    [a_outcome] = drill.finish(a)
    assert a_outcome.pop("operation") == "checkpoint commit"  # the store refused it
    assert a_outcome == {"kind": "lease_lost", "task_id": "fenced-1", "fencing_token": 1, "pid": a.pid}
    a_stderr = drill.stderr(a)
    assert f"runifold crash point before_commit:s3#1 resumed in pid {a.pid}" in a_stderr
    # The refusal is the store's answer to the commit, not A's own lease check.
    refused = "lease on task 'fenced-1' with fencing token 1 is no longer held; checkpoint commit was refused"
    assert refused in a_stderr
    assert "next step was refused" not in a_stderr

    after_a = drill.store.get_task("fenced-1")
    assert (after_a.state, after_a.worker_id, after_a.fencing_token) == (TaskState.LEASED, "fenced-b", 2)
    assert (after_a.revision, after_a.checkpoint_json) == (taken.revision, taken.checkpoint_json)
    assert entries(drill.store, "fenced-1") == journal_at_takeover
    assert drill.store.history("fenced-1") == history_at_takeover

    drill.release(b)
    [b_outcome] = drill.finish(b)
    assert (b_outcome["kind"], b_outcome["result"]) == ("completed", {"value": ((1 + 1) * 10 + 3) * 2})
    done = drill.store.get_task("fenced-1")
    assert (done.state, done.outcome, done.fencing_token) == (TaskState.TERMINAL, TaskOutcome.COMPLETED, 2)
    assert list(_journal(drill.store, "fenced-1")) == ["s1#1", "s2#1", "s3#1", "s4#1"]
    assert drill.ledger_lines("fenced-1") == [
        ("s1", a.pid),
        ("s2", a.pid),
        ("s3", a.pid),
        ("s3", b.pid),
        ("s4", b.pid),
    ]


@pytest.mark.timeout(60)
def test_stopped_owner_resumed_after_its_lease_expired_unclaimed_writes_nothing(drill: Drill) -> None:
    drill.store.enqueue(WorkflowTask.new("drill", 1, 1, checkpoint_id="late-1"))
    a = drill.start("late-a", block_at="s3")
    drill.wait_for_step("s3", "late-1", a)
    drill.stop_outside_transaction(a)
    drill.advance_past_lease("late-1")  # expired, and nobody else has claimed it
    expired = drill.store.get_task("late-1")
    history_at_expiry = drill.store.history("late-1")

    drill.release(a)
    os.kill(a.pid, signal.SIGCONT)
    [a_outcome] = drill.finish(a)
    assert a_outcome.pop("operation") in ("next step", "checkpoint commit")  # whichever saw it first
    assert a_outcome == {"kind": "lease_lost", "task_id": "late-1", "fencing_token": 1, "pid": a.pid}
    assert drill.store.get_task("late-1") == expired  # not even a heartbeat extended it
    assert drill.store.history("late-1") == history_at_expiry
    assert ("s4", a.pid) not in drill.ledger_lines("late-1")

    [b] = drill.run("late-b")
    assert (b["kind"], b["result"]) == ("completed", {"value": ((1 + 1) * 10 + 3) * 2})
    assert [step for step, _pid in drill.ledger_lines("late-1")] == ["s1", "s2", "s3", "s3", "s4"]


@pytest.mark.timeout(60)
def test_version_1_task_waiting_on_timer_completes_on_version_1_after_version_2_is_deployed(
    drill: Drill,
) -> None:
    drill.store.enqueue(WorkflowTask.new("report", 1, "sales", checkpoint_id="report-1"))
    [suspended] = drill.run("deploy-v1", registry="v1")
    assert (suspended["kind"], suspended["task_id"]) == ("suspended", "report-1")
    waiting = drill.store.get_task("report-1")
    assert waiting.state is TaskState.WAITING

    drill.advance_clock(drill_app.REPORT_SLEEP + timedelta(seconds=1))  # past the timer
    # A worker with version 2 only never claims it (routing): nothing is handed back.
    [idle] = drill.run("only-v2", registry="v2")
    assert idle["kind"] == "idle"
    unclaimed = drill.store.get_task("report-1")
    assert unclaimed == attrs.evolve(waiting, status_note=unclaimed.status_note)
    assert not [e for e in drill.store.history("report-1") if e.kind == "released"]

    drill.store.enqueue(WorkflowTask.new("report", 2, "sales", checkpoint_id="report-2"))
    drill.advance_clock(timedelta(seconds=6))  # past the definition-unavailable delay
    outcomes = drill.run("both-1", registry="both", until_idle=True)
    assert outcomes[-1]["kind"] == "idle"
    results = {o["task_id"]: o["result"] for o in outcomes[:-1] if o["kind"] == "completed"}
    assert results == {
        "report-1": {"version": 1, "output": "published rows of sales"},
        "report-2": {"version": 2, "output": "published 2 sources"},
    }
    both_pid = outcomes[0]["pid"]
    assert drill.ledger_lines("report-1") == [("collect", suspended["pid"]), ("publish", both_pid)]
    assert drill.ledger_lines("report-2") == [
        ("collect_all", both_pid),
        ("score", both_pid),
        ("publish_scored", both_pid),
    ]
    definition = from_json(drill.store.get_task("report-1").checkpoint_json or "null")["definition"]
    assert definition == {"name": "report", "version": 1, "fingerprint": drill_app.report_v1.fingerprint()}
    assert drill_app.report_v1.fingerprint() != drill_app.report_v2.fingerprint()


@pytest.mark.timeout(60)
def test_poison_task_that_kills_its_worker_every_time_fails_after_max_attempts_claims(
    drill: Drill,
) -> None:
    max_attempts = drill_app.POISON_MAX_ATTEMPTS
    drill.store.enqueue(WorkflowTask.new("poison", 1, 0, checkpoint_id="poison-1"))
    crashed: list[int] = []
    final: list[dict[str, Any]] = []
    for attempt in range(max_attempts + 3):  # bounded: a crash loop cannot hang the test
        proc = drill.start(f"poison-{attempt}")
        returncode = proc.wait(PROCESS_TIMEOUT_S)
        if returncode == -signal.SIGKILL:
            crashed.append(proc.pid)
            drill.advance_past_lease("poison-1")
            continue
        final = drill.finish(proc)
        break

    assert len(crashed) == max_attempts
    [failed] = final
    assert (failed["kind"], failed["task_id"], failed["recoverable"]) == ("failed", "poison-1", False)
    assert (
        f"claimed {max_attempts + 1} times without progress, over max_attempts={max_attempts}"
        in failed["reason"]
    )
    record = drill.store.get_task("poison-1")
    assert (record.state, record.outcome, record.reason) == (
        TaskState.TERMINAL,
        TaskOutcome.FAILED,
        failed["reason"],
    )
    # The step ran once per crashed claim and not in the claim that gave up.
    assert drill.ledger_lines("poison-1") == [("explode", pid) for pid in crashed]
    claims = [e for e in drill.store.history("poison-1") if e.kind == "claimed"]
    assert [e.fencing_token for e in claims] == list(range(1, max_attempts + 2))
