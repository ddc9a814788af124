"""The chaos tool's scenarios: one fault at a time against a steady stream of tasks, with
the figures a job-queue chaos harness reports for each (see ``tools/chaos.py``).

A scenario run first measures a baseline (tasks arrive at a steady rate and the pool
keeps up), then applies each named fault for a while and lets the pool recover before
the next. The faults:

- ``terminate-backends``: ``pg_terminate_backend`` of every worker connection to the
  store's database, every ``TERMINATE_EVERY_S`` (the workers' connections carry the
  application name ``chaos-worker``; the tool's own readers are spared);
- ``pool-exhaustion``: another client takes every free connection slot of the server
  and holds them (new connections are refused: "too many clients");
- ``idle-in-transaction``: a session opens a transaction, takes a transaction id and
  a snapshot of the task table, and sits idle in it, holding back vacuum;
- ``worker-kills``: a worker child SIGKILLed every ``KILL_EVERY_S``;
- ``pg-restart``: the server restarted (fast shutdown: every connection cut);
- ``failover``: the primary's postmaster SIGKILLed, then the synchronous standby
  promoted ``PROMOTE_AFTER_S`` later; the store's URL names both hosts with
  ``target_session_attrs=read-write``;
- ``partition-short`` and ``partition-long`` (``partition`` names both): the pool runs
  in a network namespace of its own (``netns.py``), and every packet between it and
  the server is held, silently, for ``SHORT_CUT_LEASES`` of a lease (shorter than one:
  no lease may be lost) or ``LONG_CUT_LEASES`` leases (the leases in flight expire,
  and the pool must take its tasks back once the link returns). The tool's own
  readers and the producer stay outside, connected.

For each fault the figures are (``figures``): tasks lost (never finished) and completed
twice (two completions, or the charge applied twice) among the tasks around it,
throughput during the fault as a share of the baseline's, the time to recover (from the
fault's end until every task it interrupted has finished and a second's completions are
back to ``RECOVERED_SHARE`` of the baseline's), throughput from then until the next
fault as a share of the baseline's, and pickup latency (enqueue to first claim) p99
during and after the fault, and the leases lost to it (claims that took a task over
from an expired lease, from the fault's start until the next fault). Store time is wall
time here, as for the rest of the tool.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

import attrs
from chaos_check import percentile
from chaos_db import Database, PostgresServer, note
from netns import Namespace

from runifold_sync.store import TaskEvent

HARNESS = ("terminate-backends", "pool-exhaustion", "idle-in-transaction", "worker-kills", "pg-restart")
PARTITION = ("partition-short", "partition-long")
SCENARIOS = (*HARNESS, *PARTITION, "failover")
# A partition's length in leases: shorter than one, and several.
SHORT_CUT_LEASES = 0.5
LONG_CUT_LEASES = 3.0
LEASE_SEARCH_S = 10.0  # how long a partition waits for a worker to hold a lease before it cuts
WORKER_APPLICATION = "chaos-worker"
TERMINATE_EVERY_S = 0.5
KILL_EVERY_S = 1.0
PROMOTE_AFTER_S = 1.0  # how long the standby waits before it is promoted (failure detection)
TICK_S = 0.05
WARMUP_S = 1.0  # the first second of the baseline is not measured
MIN_MEASURED_S = 1.0  # a throughput over less time than this is not reported
RECOVERED_SHARE = 0.9  # throughput this close to the baseline's is back


def clusters_needed(scenarios: Iterable[str]) -> int:
    """How many clusters of its own a run of ``scenarios`` makes: 2 for a failover (a
    primary and its standby), else 1 (the faults reach the whole server)."""
    return 2 if "failover" in scenarios else 1


def worker_url(url: str) -> str:
    """``url`` for the pool's workers: their connections named, so a fault can find them."""
    if not url.startswith("postgres"):
        return url
    return f"{url}{'&' if '?' in url else '?'}application_name={WORKER_APPLICATION}"


def _database_url(db: Database) -> str:
    """The run's database on the server that takes writes now, for a fault's own session."""
    return urlsplit(db.primary_admin_url())._replace(path=f"/{db.dbname}").geturl()


class Fault:
    """One fault: ``begin``, then ``tick`` every ``TICK_S`` until its time is up (its
    ``length_s``, or the schedule's fault time when None; a ``one_shot`` fault is done
    when ``begin`` returns), then ``end``, which says what it did as counts."""

    name = ""
    one_shot = False
    length_s: float | None = None

    def begin(self) -> None:
        raise NotImplementedError

    def tick(self) -> None:
        pass

    def end(self) -> dict[str, Any]:
        return {}


class TerminateBackends(Fault):
    name = "terminate-backends"

    def __init__(self, db: Database) -> None:
        self.db = db
        self.terminated = self.rounds = 0
        self.next_at = 0.0

    def begin(self) -> None:
        self.next_at = 0.0
        self.tick()

    def tick(self) -> None:
        if time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + TERMINATE_EVERY_S
        import psycopg

        try:
            with psycopg.connect(_database_url(self.db), autocommit=True, connect_timeout=5) as conn:
                rows = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name = %s",
                    (WORKER_APPLICATION,),
                ).fetchall()
        except psycopg.Error as exc:
            note(f"terminate-backends: {type(exc).__name__}: {exc}".splitlines()[0])
            return
        self.rounds += 1
        self.terminated += sum(1 for (done,) in rows if done)

    def end(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "backends terminated": self.terminated}


class ExhaustConnections(Fault):
    name = "pool-exhaustion"

    def __init__(self, db: Database) -> None:
        self.db = db
        self.held: list[Any] = []
        self.refusal = ""

    def begin(self) -> None:
        import psycopg

        while True:
            try:
                self.held.append(psycopg.connect(self.db.primary_admin_url(), connect_timeout=5))
            except psycopg.OperationalError as exc:
                self.refusal = str(exc).strip().splitlines()[-1]
                return
            if len(self.held) > 1000:
                raise RuntimeError("the server took 1000 connections without refusing one")

    def end(self) -> dict[str, Any]:
        for conn in self.held:
            conn.close()
        held, self.held = len(self.held), []
        return {"connections held": held, "refused with": self.refusal}


class IdleInTransaction(Fault):
    name = "idle-in-transaction"

    def __init__(self, db: Database) -> None:
        self.db = db
        self.conn: Any = None
        self.xid = 0

    def begin(self) -> None:
        import psycopg

        self.conn = psycopg.connect(_database_url(self.db), connect_timeout=5)
        row = self.conn.execute("SELECT txid_current(), (SELECT count(*) FROM runifold_tasks)").fetchone()
        self.xid = int(row[0])

    def end(self) -> dict[str, Any]:
        import psycopg

        dead = None
        try:
            with psycopg.connect(_database_url(self.db), autocommit=True, connect_timeout=5) as conn:
                row = conn.execute(
                    "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'runifold_tasks'"
                ).fetchone()
                dead = None if row is None else int(row[0])
        finally:
            self.conn.rollback()
            self.conn.close()
        return {"xmin held": self.xid, "dead task rows at the end": dead}


class KillWorkers(Fault):
    name = "worker-kills"

    def __init__(self, kill_one: Callable[[], bool]) -> None:
        self.kill_one = kill_one
        self.kills = 0
        self.next_at = 0.0

    def begin(self) -> None:
        self.next_at = 0.0
        self.tick()

    def tick(self) -> None:
        if time.monotonic() >= self.next_at:
            self.next_at = time.monotonic() + KILL_EVERY_S
            self.kills += self.kill_one()

    def end(self) -> dict[str, Any]:
        return {"kills": self.kills}


class RestartServer(Fault):
    name = "pg-restart"
    one_shot = True

    def __init__(self, db: Database) -> None:
        self.server = PostgresServer(db.primary_admin_url())
        self.restarted = False

    def begin(self) -> None:
        if self.server.cluster is None:
            raise RuntimeError("pg-restart: the server is not a local cluster this tool can restart")
        self.restarted = self.server.restart()

    def end(self) -> dict[str, Any]:
        return {"restarted": self.restarted}


class Failover(Fault):
    name = "failover"
    one_shot = True

    def __init__(self, db: Database) -> None:
        if len(db.clusters) != 2:
            raise RuntimeError("failover needs the primary and standby the run made")
        self.primary, self.standby = db.clusters
        self.promoted_s = 0.0

    def begin(self) -> None:
        self.primary.kill()
        time.sleep(PROMOTE_AFTER_S)
        began = time.monotonic()
        self.standby.promote()
        self.promoted_s = time.monotonic() - began

    def end(self) -> dict[str, Any]:
        return {"primary killed": True, "promotion took s": round(self.promoted_s, 3)}


class Partition(Fault):
    """The pool's namespace cut off from the host (``Namespace.cut``) for ``length_s``,
    at a moment a worker holds a lease (``leases_held`` counts the live leases; at most
    ``LEASE_SEARCH_S`` is spent waiting for one), so the cut meets work in flight."""

    def __init__(self, name: str, ns: Namespace, length_s: float, leases_held: Callable[[], int]) -> None:
        self.name = name
        self.ns = ns
        self.length_s = length_s
        self.leases_held = leases_held
        self.held = 0

    def begin(self) -> None:
        deadline = time.monotonic() + LEASE_SEARCH_S
        while (held := self.leases_held()) == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        self.ns.cut()
        self.held = held

    def end(self) -> dict[str, Any]:
        self.ns.restore()
        return {"cut s": self.length_s, "leases held at the cut": self.held}


def partition_length_s(name: str, lease_s: float) -> float:
    return lease_s * (SHORT_CUT_LEASES if name == "partition-short" else LONG_CUT_LEASES)


def fault_length_s(name: str, fault_s: float, lease_s: float) -> float:
    """How long fault ``name`` lasts (a one-shot fault: about none)."""
    if name in PARTITION:
        return partition_length_s(name, lease_s)
    return 0.0 if name in ("pg-restart", "failover") else fault_s


def make_fault(
    name: str,
    db: Database,
    kill_one: Callable[[], bool],
    ns: Namespace | None = None,
    lease_s: float = 0.0,
    leases_held: Callable[[], int] = lambda: 0,
) -> Fault:
    if name in PARTITION:
        if ns is None:
            raise RuntimeError(f"{name} needs the namespace the pool runs in")
        return Partition(name, ns, partition_length_s(name, lease_s), leases_held)
    if name == "terminate-backends":
        return TerminateBackends(db)
    if name == "pool-exhaustion":
        return ExhaustConnections(db)
    if name == "idle-in-transaction":
        return IdleInTransaction(db)
    if name == "worker-kills":
        return KillWorkers(kill_one)
    if name == "pg-restart":
        return RestartServer(db)
    return Failover(db)


@attrs.frozen
class Window:
    """When a fault was applied (wall time) and what it did."""

    name: str
    began: float
    ended: float
    did: dict[str, Any]


@attrs.frozen
class Schedule:
    baseline_s: float
    fault_s: float
    recovery_s: float

    def length_s(self, fault_lengths: Iterable[float]) -> float:
        """The whole schedule's length, given each fault's."""
        return self.baseline_s + sum(length + self.recovery_s for length in fault_lengths)


def apply_faults(
    faults: list[Fault], schedule: Schedule, meanwhile: Callable[[], None], stop: Callable[[], bool]
) -> list[Window]:
    """The baseline, then each fault followed by its recovery time; ``meanwhile`` runs
    every tick (the tool's own bookkeeping), ``stop`` ends the schedule early."""

    def wait(seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until and not stop():
            meanwhile()
            time.sleep(TICK_S)

    windows = []
    wait(schedule.baseline_s)
    for fault in faults:
        if stop():
            break
        began = time.time()
        note(f"fault {fault.name} begins")
        fault.begin()
        if not fault.one_shot:
            until = time.monotonic() + (schedule.fault_s if fault.length_s is None else fault.length_s)
            while time.monotonic() < until:
                meanwhile()
                fault.tick()
                time.sleep(TICK_S)
        did = fault.end()
        windows.append(Window(fault.name, began, time.time(), did))
        note(f"fault {fault.name} ended after {windows[-1].ended - began:.2f}s: {did}")
        wait(schedule.recovery_s)
    return windows


# --- the figures -------------------------------------------------------------------


@attrs.frozen
class TaskTimes:
    """One task's life from its history (wall time; store time is wall time here)."""

    enqueued: float
    claimed: float | None  # its first claim
    completed: float | None  # its first completion
    completions: int
    takeovers: tuple[float, ...] = ()  # claims that took it over from an expired lease
    lost_lease_reports: tuple[float, ...] = ()  # its workers' reports of a lease lost while cut off


def task_times(histories: dict[str, list[TaskEvent]]) -> dict[str, TaskTimes]:
    times = {}
    for task_id, events in histories.items():
        at = {kind: [e.at.timestamp() for e in events if e.kind == kind] for kind in ("enqueued", "claimed")}
        completed = [e.at.timestamp() for e in events if e.kind == "completed"]
        takeovers = tuple(
            e.at.timestamp() for e in events if e.kind == "claimed" and e.detail.get("from_state") == "leased"
        )
        reports = tuple(e.at.timestamp() for e in events if e.kind == "lease_lost")
        if at["enqueued"]:
            times[task_id] = TaskTimes(
                at["enqueued"][0],
                min(at["claimed"], default=None),
                min(completed, default=None),
                len(completed),
                takeovers,
                reports,
            )
    return times


def _latency(task: TaskTimes) -> float:
    return math.inf if task.completed is None else task.completed - task.enqueued


def _pickups(tasks: Iterable[TaskTimes]) -> list[float]:
    return [t.claimed - t.enqueued for t in tasks if t.claimed is not None]


def _rate(tasks: Iterable[TaskTimes], start: float, end: float) -> float | None:
    """Completions per second between ``start`` and ``end``; None over too short a time."""
    if end - start < MIN_MEASURED_S:
        return None
    return sum(1 for t in tasks if t.completed is not None and start <= t.completed < end) / (end - start)


def _share(rate: float | None, baseline: float | None) -> float | None:
    return None if rate is None or not baseline else round(rate / baseline, 3)


def _rounded(value: float | None) -> float | None:
    return None if value is None or math.isinf(value) else round(value, 3)


def figures(
    times: dict[str, TaskTimes], expected: Iterable[str], windows: list[Window], twice: set[str]
) -> dict[str, Any]:
    """The baseline's figures and each fault's (see the module docstring). ``expected``
    are every task the run enqueued (one missing from ``times`` was lost), ``twice`` the
    tasks whose non-idempotent effect was applied twice."""
    tasks = list(times.values())
    if not tasks or not windows:
        return {}
    start = min(t.enqueued for t in tasks) + WARMUP_S
    first = windows[0].began
    base = [t for t in tasks if start <= t.enqueued < first]
    rate = _rate(tasks, start, first)
    result: dict[str, Any] = {
        "baseline": {
            "throughput_per_s": _rounded(rate),
            "pickup_p50_s": _rounded(percentile(_pickups(base), 50)),
            "pickup_p99_s": _rounded(percentile(_pickups(base), 99)),
            "latency_p99_s": _rounded(percentile([_latency(t) for t in base], 99)),
        }
    }
    last_completion = max((t.completed for t in tasks if t.completed is not None), default=first)
    for n, window in enumerate(windows):
        after = windows[n + 1].began if n + 1 < len(windows) else last_completion
        next_began = windows[n + 1].began if n + 1 < len(windows) else math.inf
        # The tasks this fault could touch: enqueued before the next one, not finished before it began.
        alive = {
            tid: t
            for tid, t in times.items()
            if t.enqueued < after and (t.completed is None or t.completed >= window.began)
        }
        lost = [tid for tid, t in alive.items() if t.completed is None]
        if n == len(windows) - 1:
            lost += [tid for tid in expected if tid not in times]
        recovered_at = _recovered_at(window, list(alive.values()), tasks, rate, after)
        during = [t for t in alive.values() if window.began <= t.enqueued < window.ended]
        result[window.name] = {
            "did": window.did,
            "fault_s": round(window.ended - window.began, 3),
            "lost": len(lost),
            "completed_twice": sum(1 for tid, t in alive.items() if t.completions > 1 or tid in twice),
            "completed_after": sum(
                1 for t in alive.values() if t.completed is not None and t.completed >= window.ended
            ),
            "throughput_during_fault": _share(
                _rate(tasks, window.began, max(window.ended, window.began + MIN_MEASURED_S)), rate
            ),
            "time_to_recover_s": None if recovered_at is None else round(recovered_at - window.ended, 3),
            "throughput_after_recovery": None
            if recovered_at is None
            else _share(_rate(tasks, recovered_at, after), rate),
            "pickup_p99_s_during": _rounded(percentile(_pickups(during), 99)),
            "pickup_p99_s_after": _rounded(
                percentile(_pickups(t for t in alive.values() if t.enqueued >= window.ended), 99)
            ),
            "leases_lost": sum(
                1 for t in times.values() for at in t.takeovers if window.began <= at < next_began
            ),
            "lost_lease_reports": sum(
                1 for t in times.values() for at in t.lost_lease_reports if window.began <= at < next_began
            ),
            "lost_tasks": sorted(lost)[:8],
        }
    return result


def _recovered_at(
    window: Window, alive: list[TaskTimes], tasks: list[TaskTimes], rate: float | None, until: float
) -> float | None:
    """When the pool had recovered from ``window``'s fault: every task it interrupted
    (claimed before the fault ended, unfinished when it began) has finished, and the
    completions over a second are back to ``RECOVERED_SHARE`` of the baseline's rate.
    None when that did not come before ``until`` (the next fault, or the last completion)."""
    interrupted = [t for t in alive if t.claimed is not None and t.claimed < window.ended]
    if any(t.completed is None for t in interrupted):
        return None
    drained = max((t.completed for t in interrupted if t.completed is not None), default=window.ended)
    if rate is None:
        return None
    completions = sorted(
        t.completed for t in tasks if t.completed is not None and t.completed >= window.ended
    )
    needed = max(1, math.ceil(RECOVERED_SHARE * rate * MIN_MEASURED_S))
    for at, first in enumerate(completions):  # the first second after the fault with enough completions
        if first >= until:
            break
        if at + needed - 1 < len(completions) and completions[at + needed - 1] < first + MIN_MEASURED_S:
            return max(window.ended, drained, first)
    return None


def render(result: dict[str, Any]) -> list[str]:
    """One line for the baseline and one per fault."""
    if not result:
        return []

    def show(value: Any, unit: str = "") -> str:
        if value is None:
            return "n/a"
        return f"{value:.0%}" if unit == "%" else f"{value}{unit}"

    base = result["baseline"]
    lines = [
        f"scenario baseline: throughput {show(base['throughput_per_s'])}/s, pickup p50 "
        f"{show(base['pickup_p50_s'], 's')} p99 {show(base['pickup_p99_s'], 's')}, task latency p99 "
        f"{show(base['latency_p99_s'], 's')}"
    ]
    for name, fig in result.items():
        if name == "baseline":
            continue
        lines.append(
            f"scenario {name}: lost {fig['lost']}, completed twice {fig['completed_twice']}, "
            f"fault {fig['fault_s']}s, throughput during it {show(fig['throughput_during_fault'], '%')}, "
            f"time to recover {show(fig['time_to_recover_s'], 's')}, throughput after "
            f"{show(fig['throughput_after_recovery'], '%')} of baseline, pickup p99 during "
            f"{show(fig['pickup_p99_s_during'], 's')} after {show(fig['pickup_p99_s_after'], 's')}, "
            f"leases lost {fig['leases_lost']} (reported by their worker {fig['lost_lease_reports']}); "
            f"{fig['did']}"
        )
    return lines
