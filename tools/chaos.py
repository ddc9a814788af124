"""Chaos run: many workflows under a supervised pool while workers are killed and frozen.

    python tools/chaos.py --store sqlite|postgres [--tasks 300] [--steps 5] [--processes 4]
        [--kills 30] [--stops 6] [--seed N] [--duration-limit 600] [--json PATH]
    python tools/chaos.py --store postgres --scenario harness|partition|failover|NAME[,NAME...]
        [--baseline-s 5] [--fault-s 5] [--recovery-s 10] [--arrival-rate 10] [--tasks N]

M ``chaos-flow`` workflows of K calls (steps, an idempotent effect, a non-idempotent
effect reconciled from the ledger, from K=4 a child workflow started and waited for, a
short timer, a signal this tool sends) run under a
supervisor of P worker processes, started in its own process so the tool can signal its
children. Meanwhile the tool SIGKILLs random children at random moments, SIGSTOPs others
for longer than their lease and resumes them, and on PostgreSQL restarts the database
server mid-run. Then it checks (``chaos_check.py``) and prints one line per invariant:
each must be 0, and the exit status is 1 otherwise (2 when the run itself could not do
what was asked, such as fewer kills than requested).

A stop must be seen to matter: it prefers a worker that holds a lease at that moment and
lasts past the lease, and then until another worker has claimed the frozen task again (at
most TAKEOVER_WAIT_S more), so the resumed worker's late write meets a newer owner and
should be refused. The tool prints how many
stops froze a task, how many of those tasks were taken over while stopped, and how many
late writes were refused (by the worker's own lease check, the store's fence or the
ledger's). A run with stops none of which had its task taken over exercised nothing of
the stale-owner case and fails with exit status 2.

Tasks arrive during the run (``--arrival-rate``), so a killed task competes with a
realistic queue rather than the whole run's backlog, and threads wait for their ends as
callers do (``chaos_waiters.py``). Everything random comes from
``random.Random(seed)``: task plans, arrival and signal times, and the chaos schedule
(which action, after how long, on which child, for how long), so a failing seed replays
the same schedule. Process timing is the operating system's.

``--scenario`` runs the faults of a job-queue chaos harness instead, one at a time
against a steady stream of tasks (three calls each, no timer or signal), on PostgreSQL
clusters the run makes for itself (``chaos_scenarios.py``): ``harness`` names the five
(``terminate-backends``, ``pool-exhaustion``, ``idle-in-transaction``, ``worker-kills``,
``pg-restart``), ``partition`` runs the pool in a network namespace of its own and
cuts it off from the server for half a lease (``partition-short``), then for three
leases (``partition-long``) (this needs root and iproute2; without them the tool says
so and exits 2), ``failover`` kills the primary of a primary and synchronous standby
and promotes the standby. Each prints, after the invariants, the tasks it lost and
completed twice, the time to recover, the throughput against the baseline and the
leases lost.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import chaos_audit
import chaos_scenarios
import netns
from chaos_app import CHILD_TENANT, FLOW, SIGNAL, parse_ledger
from chaos_check import Kill, Refusal, RunData, Sample, Stop, render, verify
from chaos_db import ClusterError, Database, PostgresServer, note, retry
from chaos_scenarios import HARNESS, PARTITION, SCENARIOS, Schedule, Window
from chaos_waiters import ResultWaiters

from runifold_sync import BudgetUsage, WorkflowStore, WorkflowTask, open_store
from runifold_sync.errors import TaskNotFound
from runifold_sync.model.checkpoint import JournalEntry
from runifold_sync.model.codec import from_json, to_json
from runifold_sync.pool.supervisor import MAX_START_FAILURES, QUICK_CRASH_S
from runifold_sync.store import TaskEvent, TaskRecord, TaskState
from runifold_sync.store.checkpoints import read_checkpoint
from runifold_sync.store.records import SignalDelivery

TOOLS = Path(__file__).resolve().parent
SAMPLE_INTERVAL_S = 0.25
LIST_LIMIT = 10_000  # the store's most per list: the watcher samples at most this many per state
# A frozen worker stays stopped past its lease until its task has been claimed again (so the
# stale-owner case is exercised, not left to the queue's luck), but never longer than this.
TAKEOVER_WAIT_S = 15.0
FREEZE_SEARCH_S = 20.0  # how long a stop looks for a child holding a lease
# A scenario's tasks arrive well below what four workers on two loaded cores complete
# (about 30 a second), so the baseline is a pool keeping up.
DEFAULT_SCENARIO_RATE = 10.0
# A streamed scenario plans arrivals for this many times its schedule, and this much more.
STREAM_SLACK = 2.0
STREAM_SLACK_S = 60.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python tools/chaos.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--store", choices=("sqlite", "postgres"), required=True)
    p.add_argument(
        "--scenario",
        default="mixed",
        help="mixed (kills, stops and restarts at random, the default), harness, partition, failover, or "
        f"a comma-separated list of {', '.join(SCENARIOS)}",
    )
    p.add_argument(
        "--tasks", type=int, default=None, help="workflows to run (M; default 300, or a scenario's arrivals)"
    )
    p.add_argument("--steps", type=int, default=None, help="calls per workflow (K, at least 3; default 5)")
    p.add_argument("--processes", type=int, default=4, help="worker processes (P)")
    p.add_argument(
        "--kills", type=int, default=None, help="SIGKILLs of worker children (default 30; none in a scenario)"
    )
    p.add_argument("--stops", type=int, default=None, help="SIGSTOPs past the lease (default kills/5)")
    p.add_argument("--db-restarts", type=int, default=None, help="PostgreSQL server restarts (default 1)")
    p.add_argument("--seed", type=int, default=None, help="replay a run (default: random, printed)")
    p.add_argument("--duration-limit", type=float, default=600.0, help="seconds before giving up")
    p.add_argument(
        "--stall-limit-s", type=float, default=30.0, help="give up when no task changed for this long"
    )
    p.add_argument("--lease-s", type=float, default=None, help="workers' lease (default 2, 4 in a partition)")
    p.add_argument("--heartbeat-s", type=float, default=None, help="their heartbeat (default 0.5, 1 there)")
    p.add_argument(
        "--claim-batch",
        type=int,
        default=1,
        help="tasks each worker claims at once (leases kept while waiting)",
    )
    p.add_argument(
        "--step-ms", type=float, default=None, help="time each body takes (default 40, 5 in a scenario)"
    )
    p.add_argument("--timer-ms", type=int, default=200, help="the workflows' durable timer")
    p.add_argument(
        "--arrival-rate",
        type=float,
        default=None,
        help="tasks enqueued per second (0: all at the start; default 10, in a scenario 10 or --tasks "
        "spread over its schedule)",
    )
    p.add_argument("--baseline-s", type=float, default=5.0, help="a scenario's time before its first fault")
    p.add_argument("--fault-s", type=float, default=5.0, help="how long a scenario's fault lasts")
    p.add_argument("--recovery-s", type=float, default=10.0, help="a scenario's time after each fault")
    p.add_argument(
        "--signal-delay-s", type=float, default=3.0, help="a task's signal is sent up to this long after it"
    )
    p.add_argument(
        "--action-gap-s",
        type=float,
        nargs=2,
        default=None,
        metavar=("MIN", "MAX"),
        help="pause before each chaos action (default: actions spread over the arrival window)",
    )
    p.add_argument("--postgres-url", default=None, help="server for a fresh database (PostgreSQL)")
    p.add_argument("--workdir", type=Path, default=None, help="keep files here (default: temporary)")
    p.add_argument("--keep", action="store_true", help="keep the work directory and database")
    p.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    args = p.parse_args(argv)
    args.faults = _scenarios(p, args)
    args.stream = False
    # A partition's short cut is half a lease; against a 2 s lease that is within TCP's
    # own retransmission and the store's least connect timeout (2 s), which a lease must
    # outlast, so a partition's lease is the runbook's smallest sensible one.
    partition = bool(set(args.faults) & set(PARTITION))
    args.lease_s = (4.0 if partition else 2.0) if args.lease_s is None else args.lease_s
    args.heartbeat_s = (1.0 if partition else 0.5) if args.heartbeat_s is None else args.heartbeat_s
    if args.faults:
        _scenario_defaults(p, args)
    args.steps = 5 if args.steps is None else args.steps
    args.tasks = 300 if args.tasks is None else args.tasks
    args.kills = 30 if args.kills is None else args.kills
    args.arrival_rate = 10.0 if args.arrival_rate is None else args.arrival_rate
    args.step_ms = 40.0 if args.step_ms is None else args.step_ms
    if args.steps < 3:
        p.error("--steps must be at least 3 (a step, an idempotent and a non-idempotent effect)")
    if args.tasks < 1 or args.processes < 1 or args.kills < 0:
        p.error("--tasks and --processes must be >= 1, --kills >= 0")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 32)
    if args.stops is None:
        args.stops = max(1, args.kills // 5) if args.kills else 0
    if args.db_restarts is None:
        args.db_restarts = 1 if args.store == "postgres" else 0
    if args.db_restarts and args.store != "postgres":
        p.error("--db-restarts needs --store postgres")
    if args.action_gap_s is None:
        actions = max(args.kills + args.stops + args.db_restarts, 1)
        window_s = args.tasks / args.arrival_rate if args.arrival_rate > 0 else 8.0
        args.action_gap_s = (0.05, max(0.1, 1.6 * window_s / actions))
    return args


def _scenarios(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The faults ``--scenario`` names, in order; none for the mixed run."""
    if args.scenario == "mixed":
        return []
    groups = {"harness": list(HARNESS), "partition": list(PARTITION)}
    names = [name for part in args.scenario.split(",") for name in groups.get(part, [part])]
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown or len(set(names)) != len(names):
        p.error(
            f"--scenario must be mixed, harness, partition or distinct names of {', '.join(SCENARIOS)}, "
            f"got {args.scenario!r}"
        )
    if "failover" in names and names[-1] != "failover":
        p.error("--scenario: failover must come last (the run goes on against the promoted standby)")
    if "failover" in names and set(names) & set(PARTITION):
        p.error("--scenario: a partition and a failover cannot share a run (a namespace reaches one server)")
    if args.store != "postgres":
        p.error("--scenario needs --store postgres (its faults are the server's)")
    return names


def _scenario_defaults(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A scenario's tasks arrive at a steady rate through its whole schedule, three calls
    each without a timer or signal, and nothing else is done to the pool."""
    if args.postgres_url is not None:
        p.error("--postgres-url: a scenario makes the clusters it runs on")
    if args.kills or args.stops or args.db_restarts:
        p.error("--kills, --stops and --db-restarts belong to the mixed run; a scenario's faults are its own")
    args.kills, args.stops, args.db_restarts = 0, 0, 0
    args.steps = 3 if args.steps is None else args.steps
    length_s = Schedule(args.baseline_s, args.fault_s, args.recovery_s).length_s(
        chaos_scenarios.fault_length_s(name, args.fault_s, args.lease_s) for name in args.faults
    )
    if args.arrival_rate is None:
        args.arrival_rate = DEFAULT_SCENARIO_RATE if args.tasks is None else args.tasks / length_s
    # Without --tasks, tasks arrive until the schedule's last recovery is over, however
    # long its faults took (a loaded machine stretches them: a restart, the connections a
    # fault opens); planned for STREAM_SLACK times the schedule, the ones not yet due
    # then are never enqueued. A fixed count ran out before the last fault under load.
    args.stream = args.tasks is None
    if args.tasks is None:
        if args.arrival_rate <= 0:
            p.error("--arrival-rate 0 (every task enqueued at the start) needs --tasks")
        args.tasks = max(1, round(args.arrival_rate * (STREAM_SLACK * length_s + STREAM_SLACK_S)))
    args.step_ms = 5.0 if args.step_ms is None else args.step_ms


# --- the plan ----------------------------------------------------------------------


def plan_tasks(rng: random.Random, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    specs = {}
    for n in range(args.tasks):
        calls = ["notify", "charge", "child"] if args.steps >= 4 else ["notify", "charge"]
        plan = calls + ["step"] * (args.steps - len(calls))
        rng.shuffle(plan)
        specs[f"chaos-{n:05d}"] = {
            "n": n,
            "start": rng.randrange(1000),
            "plan": plan,
            # A scenario's tasks neither sleep nor wait (-1: after no call).
            "timer_after": -1 if args.faults else rng.randrange(args.steps),
            "signal_after": -1 if args.faults else rng.randrange(args.steps),
            "timer_ms": args.timer_ms,
        }
    return specs


@attrs.frozen
class Action:
    kind: str  # "kill", "stop" or "restart"
    gap_s: float  # wait before it
    pick: float  # which child, as a fraction of the sorted live children
    stop_s: float  # how long a stop lasts beyond the lease


@attrs.frozen
class _Frozen:
    due: float  # monotonic time the stop's planned length ends
    stopped_at: float  # wall time, for the check
    worker_id: str
    leases: dict[str, int]  # task id -> fencing token held when the stop began


def plan_chaos(rng: random.Random, args: argparse.Namespace) -> list[Action]:
    kinds = ["kill"] * args.kills + ["stop"] * args.stops
    rng.shuffle(kinds)
    # Restarts spread over the middle of the schedule, but after the stops: a stop needs a
    # worker holding a lease, and after a restart, on a quiet machine, the run's last
    # tasks could end before a planned stop found one (both stops skipped, on two seeds).
    after_stops = max((n + 1 for n, kind in enumerate(kinds) if kind == "stop"), default=0)
    for k in range(args.db_restarts):
        kinds.insert(max((k + 1) * len(kinds) // (args.db_restarts + 1), after_stops + k), "restart")
    low, high = args.action_gap_s
    return [Action(k, rng.uniform(low, high), rng.random(), rng.uniform(0.3, 1.2)) for k in kinds]


# --- the run -----------------------------------------------------------------------


_LEASE_LOST = re.compile(
    r"lease on task '([^']+)' with fencing token (\d+) is no longer held; (.+) was refused"
)


def parse_refusals(path: Path) -> list[Refusal]:
    """The lease losses the workers logged (one line each, see ``LeaseLostError``)."""
    text = path.read_text(errors="replace") if path.exists() else ""
    return [Refusal(task, int(token), op) for task, token, op in _LEASE_LOST.findall(text)]


def _proc_state(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) of a live process, None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


class Chaos:
    """The supervisor process and what is done to its children."""

    def __init__(
        self,
        args: argparse.Namespace,
        db: Database,
        workdir: Path,
        rng: random.Random,
        ns: netns.Namespace | None = None,
    ) -> None:
        self.args = args
        self.db = db
        self.workdir = workdir
        self.rng = rng
        self.kills: list[Kill] = []
        self.first_seen: dict[int, float] = {}  # child pid -> when children() first listed it
        self.quick_kills: dict[str, int] = {}  # worker id -> its slot's kills in a row at start
        self.stopped: dict[int, _Frozen] = {}  # pid -> what its stop froze
        self.stop_log: list[Stop] = []
        self.stops = self.stops_skipped = self.restarts = 0
        self.store: WorkflowStore | None = None
        restarts = db.kind == "postgres" and args.db_restarts > 0
        self.server = PostgresServer(db.admin_url or "") if restarts else None
        env = dict(os.environ, CHAOS_STEP_MS=str(args.step_ms), PYTHONUNBUFFERED="1")
        self.err = open(workdir / "supervisor.err", "w")  # noqa: SIM115 - closed in finish()
        # In a partition scenario the pool runs in its own namespace (``ip netns exec``
        # execs the command in place: the process is the supervisor itself).
        url = db.url if ns is None else _through_namespace(db.url, ns)
        command = [sys.executable, str(TOOLS / "chaos_app.py"), "--url", chaos_scenarios.worker_url(url)]
        command += ["--workdir", str(workdir), "--processes", str(args.processes)]
        command += ["--lease-s", str(args.lease_s), "--heartbeat-s", str(args.heartbeat_s)]
        command += ["--claim-batch", str(args.claim_batch)]
        self.proc = subprocess.Popen(
            command if ns is None else ns.command(*command),
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
            env=env,
            start_new_session=True,
        )

    def wait_until_ready(self, timeout_s: float = 120.0) -> None:
        """Return once every child has registered with the store (it is in its loop,
        ready to claim): a scenario's baseline must not measure the pool's start."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            children = self.children()
            try:
                self.store = self.store or open_store(self.db.url)
                registered = {(w.worker_id, w.pid) for w in self.store.workers() if w.stopped_at is None}
            except Exception:
                registered = set()
            if len(children) == self.args.processes and all(
                (worker_id, pid) in registered for pid, worker_id in children.items()
            ):
                return
            time.sleep(0.05)
        raise RuntimeError(f"the pool's {self.args.processes} workers did not start within {timeout_s:.0f}s")

    def busy(self, fallback: frozenset[str]) -> frozenset[str]:
        """Worker ids holding a lease now (``fallback``, the last sample, if the store is away)."""
        try:
            self.store = self.store or open_store(self.db.url)
            leased = self.store.list_tasks(state=TaskState.LEASED, definition=FLOW, limit=LIST_LIMIT)
        except Exception:
            return fallback
        return frozenset(r.worker_id for r in leased if r.worker_id)

    def children(self) -> dict[int, str]:
        """Live, running (not stopped) children of the supervisor: pid -> worker id."""
        path = self.workdir / "workers.txt"
        live = {}
        for line in path.read_text().splitlines() if path.exists() else []:
            fields = line.split()
            if len(fields) != 2 or not fields[0].isdigit():
                continue  # a registration being written
            state = _proc_state(int(fields[0]))
            if state is not None and state[1] == self.proc.pid and state[0] not in "ZXxTt":
                live[int(fields[0])] = fields[1]
                self.first_seen.setdefault(int(fields[0]), time.monotonic())
        return live

    def may_kill(self, pid: int, worker_id: str) -> bool:
        """Whether killing ``pid`` leaves its slot short of the supervisor's crash-loop
        stop (``MAX_START_FAILURES`` deaths in a row, each within ``QUICK_CRASH_S`` of
        starting): chaos kills a young child of one slot at most that many times less
        two in a row, leaving room for a death of its own (a start during the database
        restart). Under load the kills otherwise bunched on one slot and the pool
        stopped itself, which is the supervisor doing its job, not a finding."""
        return not self.young(pid) or self.quick_kills.get(worker_id, 0) < MAX_START_FAILURES - 2

    def young(self, pid: int) -> bool:
        """Whether a death of ``pid`` now would count as a quick one to the supervisor."""
        return time.monotonic() - self.first_seen.get(pid, 0.0) < QUICK_CRASH_S

    def perform(self, action: Action, busy: frozenset[str]) -> None:
        """Do ``action``; a kill prefers a child that held a lease when last sampled, so
        most kills interrupt a task rather than an idle loop; a stop waits for a child
        that holds one (see ``_freeze_lease_holder``)."""
        if action.kind == "restart":
            self._restart_database()
            return
        if action.kind == "stop":
            if not self._freeze_lease_holder(action):
                self.stops_skipped += 1
            return
        # One wait, of at most QUICK_CRASH_S, for a child to kill: one running (all dead
        # or stopped: the supervisor forks anew) and past its youth if its slot was
        # killed at start in a row.
        deadline = time.monotonic() + QUICK_CRASH_S
        while True:
            children = self.children()
            allowed = {pid: wid for pid, wid in children.items() if self.may_kill(pid, wid)}
            if allowed or time.monotonic() > deadline:
                break
            time.sleep(0.05)
            self.resume_due()
        if not children:
            note(f"no running child to {action.kind}")
            return
        if not allowed:
            note("every child is young on a slot killed at start in a row; killing one anyway")
            allowed = children
        pids = sorted(pid for pid, worker_id in allowed.items() if worker_id in busy) or sorted(allowed)
        pid = pids[min(int(action.pick * len(pids)), len(pids) - 1)]
        self.quick_kills[allowed[pid]] = self.quick_kills.get(allowed[pid], 0) + 1 if self.young(pid) else 0
        os.kill(pid, signal.SIGKILL)
        self.kills.append(Kill(time.time(), pid, allowed[pid]))

    def _running_children(self) -> dict[int, str]:
        """The live, running children, waiting a while when all are dead or stopped."""
        children = self.children()
        deadline = time.monotonic() + 10
        while not children and time.monotonic() < deadline:
            time.sleep(0.01)
            self.resume_due()
            children = self.children()
        return children

    def _freeze_lease_holder(self, action: Action) -> bool:
        """SIGSTOP a child while it holds a lease, so the stop exercises a stale owner:
        pick among the children the store shows holding one, stop it, and keep it
        stopped only if it still holds that lease once frozen (otherwise resume it and
        look again). At least one other child must be running to take the task over.
        Most of a chaos run's workers are idle between timers and signals, so this may
        take a while; after FREEZE_SEARCH_S the stop is skipped."""
        deadline = time.monotonic() + FREEZE_SEARCH_S
        while time.monotonic() < deadline:
            self.resume_due()
            running = self._running_children()
            held = self.leases()
            holding = {pid: wid for pid, wid in running.items() if wid in held}
            # Someone must stay running to take the frozen task over.
            if not holding or len(running) < 2:
                time.sleep(0.02)
                continue
            pids = sorted(holding)
            pid = pids[min(int(action.pick * len(pids)), len(pids) - 1)]
            if not self._stop(pid):
                continue
            leases = self.leases().get(holding[pid], {})  # what it holds now that it cannot move
            if not leases:
                os.kill(pid, signal.SIGCONT)
                continue
            self.stops += 1
            due = time.monotonic() + self.args.lease_s + action.stop_s
            self.stopped[pid] = _Frozen(due, time.time(), holding[pid], leases)
            return True
        note("no child held a lease long enough to be frozen with it; stop skipped")
        return False

    def _stop(self, pid: int) -> bool:
        """SIGSTOP ``pid``. On SQLite only at a moment it holds no write lock: a process
        frozen inside a write transaction blocks every writer of the file (SQLite's single
        writer), which is not the lease protocol under test."""
        for _ in range(50):
            os.kill(pid, signal.SIGSTOP)
            deadline = time.monotonic() + 2
            while (state := _proc_state(pid)) is not None and state[0] not in "Tt":
                if time.monotonic() > deadline:
                    break
                time.sleep(0.001)
            if state is None:
                return False
            if self.db.kind != "sqlite" or not self._write_locked():
                return True
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.005 + self.rng.random() * 0.02)
        return False

    def _write_locked(self) -> bool:
        conn = sqlite3.connect(self.db.url.removeprefix("sqlite:///"), timeout=0.3, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return False
        except sqlite3.OperationalError:
            return True
        finally:
            conn.close()

    def leases(self) -> dict[str, dict[str, int]]:
        """Worker id -> {task id: fencing token} of the live leases its running process
        holds now (empty if the store cannot say). A killed process leaves its leases in
        the store under the worker id its replacement reuses until they expire; a lease
        last extended before the latest kill of that id is the dead process's."""
        try:
            self.store = self.store or open_store(self.db.url)
            leased = self.store.list_tasks(state=TaskState.LEASED, definition=FLOW, limit=LIST_LIMIT)
            now = self.store.now().timestamp()
        except Exception:
            return {}
        killed_at = {kill.worker_id: kill.at for kill in self.kills}
        held: dict[str, dict[str, int]] = {}
        for record in leased:
            if record.worker_id is None or record.lease_expires is None:
                continue
            expires = record.lease_expires.timestamp()
            if expires <= now or expires - self.args.lease_s <= killed_at.get(record.worker_id, 0.0):
                continue
            held.setdefault(record.worker_id, {})[record.task_id] = record.fencing_token
        return held

    def _taken_over(self, frozen: _Frozen) -> bool:
        """Whether every lease the stop froze has moved on (claimed again with a higher
        token, or ended by a write that landed just before the stop)."""
        try:
            self.store = self.store or open_store(self.db.url)
            records = [self.store.get_task(task_id) for task_id in frozen.leases]
        except Exception:
            return False
        return all(
            r.state is not TaskState.LEASED or r.fencing_token > frozen.leases[r.task_id] for r in records
        )

    def resume_due(self, everything: bool = False) -> None:
        now = time.monotonic()
        for pid, frozen in list(self.stopped.items()):
            if not everything and now < frozen.due:
                continue
            if not everything and now < frozen.due + TAKEOVER_WAIT_S and not self._taken_over(frozen):
                continue
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            del self.stopped[pid]
            self.stop_log.append(Stop(frozen.stopped_at, time.time(), pid, frozen.worker_id))

    def _restart_database(self) -> None:
        if self.server is None or self.server.cluster is None:
            note("database restart skipped: the server is not a local cluster this tool can restart")
            return
        began = time.monotonic()
        if self.server.restart():
            self.restarts += 1
            note(f"PostgreSQL restarted in {time.monotonic() - began:.2f}s")
        else:
            note("PostgreSQL restart failed (someone else restarting it?); it is running again")

    def finish(self) -> dict[str, Any]:
        """Resume everyone, stop the pool gracefully, return its report."""
        self.resume_due(everything=True)
        if self.store is not None:
            self.store.close()
        if self.server is not None:
            self.server.ensure_running()
        report: dict[str, Any] = {}
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=self.args.lease_s * 5 + 30)
            report = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        except subprocess.TimeoutExpired:
            note("the supervisor did not stop; killing its process group")
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        finally:
            self.err.close()
        return report


def _through_namespace(url: str, ns: netns.Namespace) -> str:
    """``url`` (a database on a cluster of the run's own) as a process inside ``ns``
    reaches it: through the host end of the namespace's link."""
    parts = urlsplit(url)
    return parts._replace(netloc=f"{parts.username}@{ns.host_ip}:{parts.port}").geturl()


def _make_namespace(db: Database) -> netns.Namespace:
    """A namespace for the pool, and the run's cluster listening on its host address
    (restarted for it); raises ``netns.NetnsError`` where none can be made."""
    ns = netns.create()
    try:
        cluster = db.clusters[0]
        netns.allow_namespace(cluster.config, ns)
        cluster.ctl("restart")
        cluster.wait_until(cluster.online, "answering after its restart to listen on the namespace")
    except BaseException:
        ns.delete()
        raise
    return ns


class Watcher(threading.Thread):
    """Samples every unfinished task's revision and usage, and notices when all are
    terminal (counted, not listed: a run may have more tasks than one list returns)."""

    def __init__(self, url: str, total: int) -> None:
        super().__init__(name="chaos-watcher", daemon=True)
        self.url = url
        self.total = total
        self.samples: list[Sample] = []
        self.done = threading.Event()
        self.progress_at = time.monotonic()  # when the tasks last changed
        self.busy: frozenset[str] = frozenset()  # worker ids holding a lease at the last sample
        self._last: dict[str, int] = {}  # task id -> revision and state; "" -> tasks finished
        self.stop = threading.Event()

    def run(self) -> None:
        store: WorkflowStore | None = None
        while not self.stop.is_set():
            try:
                store = store or open_store(self.url)
                records = [
                    record
                    for state in (TaskState.QUEUED, TaskState.LEASED, TaskState.WAITING)
                    for record in store.list_tasks(state=state, definition=FLOW, limit=LIST_LIMIT)
                ]
                finished = sum(
                    s.count
                    for s in store.queue_stats()
                    if s.state is TaskState.TERMINAL and s.tenant != CHILD_TENANT
                )
            except Exception as exc:  # the server restarting: sample again shortly
                note(f"watcher: {type(exc).__name__}")
                self.stop.wait(SAMPLE_INTERVAL_S)
                continue
            at = time.time()
            for rec in records:
                if rec.checkpoint_json is not None:
                    usage = BudgetUsage(**from_json(rec.checkpoint_json)["usage"])
                    self.samples.append(Sample(at, rec.task_id, rec.revision, usage))
            self.busy = frozenset(r.worker_id for r in records if r.state is TaskState.LEASED and r.worker_id)
            revisions = {r.task_id: r.revision * 10 + list(TaskState).index(r.state) for r in records}
            revisions[""] = finished
            if revisions != self._last:
                self._last = revisions
                self.progress_at = time.monotonic()
            if finished >= self.total:
                self.done.set()
            self.stop.wait(SAMPLE_INTERVAL_S)
        if store is not None:
            store.close()


@attrs.frozen
class Arrival:
    at_s: float  # offset from the start of the run
    kind: str  # "enqueue" or "signal"
    task_id: str
    duplicate: bool = False  # a signal sent twice with one id


def plan_arrivals(
    rng: random.Random, args: argparse.Namespace, specs: dict[str, dict[str, Any]]
) -> list[Arrival]:
    """Tasks arrive at ``--arrival-rate`` (exponential gaps; in a scenario evenly, so a
    second's completions are its throughput); each one's signal follows it within
    ``--signal-delay-s``, so it finds its wait sometimes before, sometimes after."""
    order = list(specs)
    rng.shuffle(order)
    arrivals, at_s = [], 0.0
    for task_id in order:
        if args.arrival_rate > 0 and args.faults:  # evenly: a scenario measures throughput
            at_s += 1 / args.arrival_rate
        elif args.arrival_rate > 0:
            at_s += rng.expovariate(args.arrival_rate)
        arrivals.append(Arrival(at_s, "enqueue", task_id))
        if specs[task_id]["signal_after"] < 0:
            continue
        delay_s = rng.uniform(0, args.signal_delay_s)
        arrivals.append(Arrival(at_s + delay_s, "signal", task_id, rng.random() < 0.1))
    return sorted(arrivals, key=lambda a: (a.at_s, a.kind))


class Producer(threading.Thread):
    """Enqueues the tasks and sends their signals on schedule, retrying while the
    database is away (enqueue and signal ids are idempotent)."""

    def __init__(self, url: str, specs: dict[str, dict[str, Any]], arrivals: list[Arrival]) -> None:
        super().__init__(name="chaos-producer", daemon=True)
        self.url = url
        self.specs = specs
        self.arrivals = arrivals
        self.sent = self.duplicates = 0
        self.enqueued: list[str] = []  # in order, once the store took each
        self.stop = threading.Event()

    def run(self) -> None:
        store = retry(lambda: open_store(self.url))
        started = time.monotonic()
        try:
            for arrival in self.arrivals:
                if self.stop.wait(max(0.0, started + arrival.at_s - time.monotonic())):
                    return
                if arrival.kind == "enqueue":
                    task = WorkflowTask.new(
                        FLOW, 1, self.specs[arrival.task_id], checkpoint_id=arrival.task_id
                    )
                    retry(partial(store.enqueue, task))
                    self.enqueued.append(arrival.task_id)
                    continue
                for _ in range(2 if arrival.duplicate else 1):
                    delivery = retry(partial(self._signal, store, arrival.task_id))
                    self.sent += delivery.created
                    self.duplicates += not delivery.created
        finally:
            store.close()

    def _signal(self, store: WorkflowStore, task_id: str) -> SignalDelivery:
        payload = {"n": self.specs[task_id]["n"]}
        return store.send_signal(task_id, SIGNAL, payload, signal_id=f"go-{task_id}", sender="chaos")


READERS = 4  # threads reading a run back: its tasks one by one, on the store's pool


def _read_back(
    store: WorkflowStore, specs: dict[str, dict[str, Any]]
) -> tuple[dict[str, TaskRecord], dict[str, list[TaskEvent]], dict[str, list[dict[str, Any]]]]:
    """Every task of the run (with the children its plan starts), its history and its
    main journal's entries, read one task at a time (a list stops at LIST_LIMIT tasks)
    by a few threads."""

    def one(task_id: str) -> list[tuple[TaskRecord, list[TaskEvent], list[dict[str, Any]]]]:
        try:
            records = [retry(partial(store.get_task, task_id))]
        except TaskNotFound:
            return []  # reported as lost
        if "child" in specs[task_id]["plan"]:
            records += retry(partial(store.list_tasks, parent=task_id))
        return [
            (
                record,
                retry(partial(store.history, record.task_id)),
                [from_json(to_json(e)) for e in retry(partial(_main_journal, store, record.task_id))],
            )
            for record in records
        ]

    tasks, histories, journals = {}, {}, {}
    with ThreadPoolExecutor(READERS) as readers:
        for found in readers.map(one, specs):
            for record, history, journal in found:
                tasks[record.task_id] = record
                histories[record.task_id] = history
                journals[record.task_id] = journal
    return tasks, histories, journals


def _main_journal(store: WorkflowStore, task_id: str) -> list[JournalEntry]:
    checkpoint = read_checkpoint(store, task_id)
    return [] if checkpoint is None else checkpoint.journal


def _drive(
    args: argparse.Namespace,
    db: Database,
    ns: netns.Namespace | None,
    chaos: Chaos,
    watcher: Watcher,
    producer: Producer,
    actions: list[Action],
    deadline: float,
) -> list[Window]:
    """Apply the scenario's faults in turn (``chaos_scenarios.apply_faults``) or the
    mixed run's actions, then wait until every task has finished (or nothing moved for
    ``--stall-limit-s``); the scenario's fault windows."""

    def kill_one() -> bool:
        kills = len(chaos.kills)
        chaos.perform(Action("kill", 0.0, chaos.rng.random(), 0.0), chaos.busy(watcher.busy))
        return len(chaos.kills) > kills

    def leases_held() -> int:
        return sum(len(leases) for leases in chaos.leases().values())

    faults = [
        chaos_scenarios.make_fault(name, db, kill_one, ns, args.lease_s, leases_held) for name in args.faults
    ]
    schedule = Schedule(args.baseline_s, args.fault_s, args.recovery_s)
    windows = chaos_scenarios.apply_faults(
        faults,
        schedule,
        chaos.resume_due,
        lambda: time.monotonic() > deadline or chaos.proc.poll() is not None,
    )
    if args.stream:  # the schedule is over: no more arrivals, and the run waits for what came
        producer.stop.set()
        producer.join()
        watcher.total = len(producer.enqueued)
        note(f"the schedule ended; {len(producer.enqueued)} tasks arrived during it")
    pending = list(actions)
    next_at = time.monotonic() + (pending[0].gap_s if pending else 0)
    while time.monotonic() < deadline and chaos.proc.poll() is None:
        chaos.resume_due()
        if pending and time.monotonic() >= next_at:
            chaos.perform(pending.pop(0), chaos.busy(watcher.busy))
            next_at = time.monotonic() + (pending[0].gap_s if pending else 0)
        if not pending and not chaos.stopped and watcher.done.is_set():
            break
        if not pending and not producer.is_alive():
            stalled_s = time.monotonic() - watcher.progress_at
            if stalled_s > args.stall_limit_s:
                note(f"no task changed for {stalled_s:.0f}s; giving up on the unfinished ones")
                break
        time.sleep(0.005)
    return windows


def _scenario_figures(data: RunData, windows: list[Window]) -> dict[str, Any]:
    """Each fault's figures (``chaos_scenarios.figures``) from the run's histories."""
    times = chaos_scenarios.task_times(
        {tid: data.histories[tid] for tid in data.specs if tid in data.histories}
    )
    charges: dict[tuple[str, str], int] = {}
    for line in data.ledger:
        if line.kind == "charge":
            charges[(line.task_id, line.call_id)] = charges.get((line.task_id, line.call_id), 0) + 1
    twice = {task_id for (task_id, _call), count in charges.items() if count > 1}
    return chaos_scenarios.figures(times, data.specs, windows, twice)


def _fault_shortfalls(windows: list[Window], faults: list[str]) -> list[str]:
    """Faults that were not applied, or did nothing (no backend terminated, no worker
    killed...): their figures would prove nothing."""
    shortfalls = [f"fault {name} was never applied" for name in faults[len(windows) :]]
    for window in windows:
        did = window.did
        if not all(
            did.get(key, 1)
            for key in (
                "backends terminated",
                "connections held",
                "kills",
                "restarted",
                "leases held at the cut",
            )
        ):
            shortfalls.append(f"fault {window.name} did nothing: {did}")
    return shortfalls


def run(args: argparse.Namespace) -> int:
    # Connection errors while the server restarts are expected here; the threads retry.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    rng = random.Random(args.seed)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="runifold-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(
        f"chaos: store={args.store} tasks={args.tasks} steps={args.steps} processes={args.processes} "
        f"kills={args.kills} stops={args.stops} db_restarts={args.db_restarts} seed={args.seed} "
        f"workdir={workdir}",
        flush=True,
    )
    try:
        own = chaos_scenarios.clusters_needed(args.faults) if args.faults else 0
        db = Database.create(args.store, workdir, args.postgres_url, own_clusters=own)
    except ClusterError as exc:
        print(f"chaos: cannot make the clusters the scenario runs on: {exc}", flush=True)
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
        return 2
    failed = True
    ns: netns.Namespace | None = None
    try:
        if set(args.faults) & set(PARTITION):
            try:
                ns = _make_namespace(db)
            except (netns.NetnsError, OSError, subprocess.TimeoutExpired) as exc:
                print(f"chaos: cannot make a network namespace for the pool: {exc}", flush=True)
                return 2
        specs = plan_tasks(rng, args)
        store = open_store(db.url)
        chaos_audit.install(args.store, db.url)
        actions = plan_chaos(rng, args)
        arrivals = plan_arrivals(rng, args, specs)

        started = time.monotonic()
        chaos = Chaos(args, db, workdir, rng, ns)
        watcher = Watcher(db.url, len(specs))
        producer = Producer(db.url, specs, arrivals)
        waiters = ResultWaiters(db.url, [a.task_id for a in arrivals if a.kind == "enqueue"])
        report: dict[str, Any] = {}
        try:
            if args.faults:
                chaos.wait_until_ready()
            watcher.start()
            producer.start()
            waiters.start()
            deadline = started + args.duration_limit
            windows = _drive(args, db, ns, chaos, watcher, producer, actions, deadline)
            elapsed_s = time.monotonic() - started
        finally:
            waits = waiters.finish()
            report = chaos.finish()
            producer.stop.set()
            watcher.stop.set()
            for thread in (producer, watcher):
                if thread.ident is not None:  # started
                    thread.join(30)

        if args.stream:  # only the tasks that arrived before the schedule ended
            specs = {task_id: specs[task_id] for task_id in producer.enqueued}
        reading = time.monotonic()
        tasks, histories, journals = _read_back(store, specs)
        store.close()
        note(f"read {len(tasks)} tasks, their histories and journals in {time.monotonic() - reading:.1f}s")
        data = RunData(
            specs=specs,
            tasks=tasks,
            journals=journals,
            histories=histories,
            ledger=parse_ledger(workdir / "ledger.txt"),
            refused=parse_ledger(workdir / "refused.txt"),
            samples=watcher.samples,
            kills=chaos.kills,
            integrity=db.integrity(),
            writes=retry(partial(chaos_audit.read, args.store, db.url)),
            journal_writes=retry(partial(chaos_audit.read_journal_writes, args.store, db.url)),
            batched=retry(partial(chaos_audit.completions_committed_together, args.store, db.url)),
            stops=chaos.stop_log,
            refusals=parse_refusals(workdir / "supervisor.err"),
            waits=waits,
        )
        verdict = verify(data)
        outcomes = report.get("outcomes", {})
        print(
            f"chaos: finished in {elapsed_s:.1f}s: kills {len(chaos.kills)}, stops {chaos.stops} "
            f"(skipped {chaos.stops_skipped}), db restarts {chaos.restarts}, supervisor restarts "
            f"{report.get('restarts')}, outcomes {json.dumps(outcomes, sort_keys=True)}, signals sent "
            f"{producer.sent} (+{producer.duplicates} duplicates)",
            flush=True,
        )
        for line in render(verdict):
            print(line, flush=True)
        scenarios = _scenario_figures(data, windows) if args.faults else {}
        for line in chaos_scenarios.render(scenarios):
            print(line, flush=True)
        shortfalls = _fault_shortfalls(windows, args.faults)
        if len(chaos.kills) < args.kills:
            shortfalls.append(f"only {len(chaos.kills)} of {args.kills} kills happened before the end")
        if chaos.stops < args.stops:
            shortfalls.append(f"only {chaos.stops} of {args.stops} stops happened")
        if chaos.stops and not verdict.figures["stops whose task was taken over while stopped"]:
            shortfalls.append(
                f"none of the {chaos.stops} stops had its task taken over while stopped: "
                "the stale-owner scenario was not exercised"
            )
        if chaos.restarts < args.db_restarts:
            shortfalls.append(f"only {chaos.restarts} of {args.db_restarts} database restarts happened")
        for text in shortfalls:
            print(f"shortfall {text}", flush=True)
        if args.json is not None:
            args.json.write_text(
                json.dumps(
                    {
                        "seed": args.seed,
                        "store": args.store,
                        "elapsed_s": elapsed_s,
                        "invariants": verdict.invariants,
                        "figures": verdict.figures,
                        "kills": len(chaos.kills),
                        "stops": chaos.stops,
                        "db_restarts": chaos.restarts,
                        "supervisor": report,
                        "scenarios": scenarios,
                        "shortfalls": shortfalls,
                        "violations": verdict.details,
                    },
                    indent=2,
                    default=str,
                )
            )
        code = 0 if verdict.ok and not shortfalls else (1 if not verdict.ok else 2)
        failed = code != 0
        print(f"result: {'PASS' if code == 0 else 'FAIL'} (seed {args.seed}; replay with --seed {args.seed})")
        return code
    finally:
        if ns is not None:
            ns.delete()
        if failed or args.keep:
            kept = f" and database {db.dbname}" if db.dbname else ""
            kept += "".join(f", cluster {cluster.name}" for cluster in db.clusters)
            print(f"chaos: kept {workdir}{kept}", flush=True)
        else:
            db.drop()
            if args.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
