"""The invariants a chaos run must keep, computed from what really happened.

Inputs are independent of the engine's own bookkeeping where they can be: the ledger
the step bodies wrote outside the store (what ran, under which fencing token), an audit
of every write the database accepted to the tasks table (a trigger, see
``chaos_audit.py``), the store's history (who wrote what, under which token), the final
checkpoints (which execution of each step was the committed one) and usage samples
taken during the run.

Besides the run's own expectations (every task completed with the right result), it
proves what any history of the store must show, whatever the faults: no fencing token
with two owners (the history's events under a token name one worker, and the body
results committed under it were run by one process); every call of a task committed
with one run only; every non-idempotent effect applied at most once, and each one
applied recorded by its task or parking it for a reconcile; every task that did not
complete saying why. Each finding is printed as a count; ``tests/tools/test_chaos_check.py``
plants each violation in a history and asserts it is counted.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import attrs
from chaos_app import LedgerLine
from chaos_audit import JournalWrite, Write
from chaos_waiters import Wait, unheard_ends, woken_by_the_end

from runifold_sync import BudgetUsage
from runifold_sync.model.codec import from_json
from runifold_sync.model.effects import read_evidence
from runifold_sync.store import TaskEvent, TaskOutcome, TaskRecord, TaskState

# Events that end the cycle of the token that wrote them.
CYCLE_ENDS = frozenset({"suspended", "completed", "failed", "released", "retried", "cancelled"})
DETAIL_LIMIT = 8
LEDGER_REFUSALS = "stale bodies refused by the ledger's fence"
STORE_REFUSALS = "writes refused by the store's fence"
WORKER_REFUSALS = "bodies refused by the worker's lease check"


@attrs.frozen
class Kill:
    at: float  # wall time just after SIGKILL; store time is wall time here (no offset)
    pid: int
    worker_id: str


@attrs.frozen
class Stop:
    at: float  # wall time once the child was seen stopped
    resumed_at: float  # wall time of its SIGCONT
    pid: int
    worker_id: str


@attrs.frozen
class Refusal:
    """A lease loss a worker logged: ``operation`` is ``next step`` when the worker's own
    lease check stopped it before a body, otherwise the write the store's fence refused."""

    task_id: str
    token: int
    operation: str


@attrs.frozen
class Sample:
    at: float
    task_id: str
    revision: int
    usage: BudgetUsage


@attrs.frozen
class RunData:
    specs: dict[str, dict[str, Any]]  # task id -> input
    tasks: dict[str, TaskRecord]
    journals: dict[str, list[dict[str, Any]]]  # task id -> its main journal's entries, at the end
    histories: dict[str, list[TaskEvent]]
    ledger: list[LedgerLine]
    refused: list[LedgerLine]
    samples: list[Sample]
    kills: list[Kill]
    integrity: str | None  # SQLite PRAGMA integrity_check; None on PostgreSQL
    writes: list[Write] = attrs.Factory(list)  # the audit, in the order writes were accepted
    journal_writes: list[JournalWrite] = attrs.Factory(list)  # the journal rows' audit
    stops: list[Stop] = attrs.Factory(list)
    refusals: list[Refusal] = attrs.Factory(list)
    waits: list[Wait] = attrs.Factory(list)  # callers' wait_for_task calls (chaos_waiters)
    batched: int = 0  # completions committed in one transaction with another task's


@attrs.define
class Verdict:
    """Invariant counts (each must be 0), figures, and details of any violation."""

    invariants: dict[str, int] = attrs.Factory(dict)
    figures: dict[str, Any] = attrs.Factory(dict)
    details: list[str] = attrs.Factory(list)

    def count(self, name: str, problems: Iterable[str]) -> None:
        found = list(problems)
        self.invariants[name] = len(found)
        self.details.extend(f"{name}: {p}" for p in found[:DETAIL_LIMIT])

    @property
    def ok(self) -> bool:
        return not any(self.invariants.values())


def percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


def verify(data: RunData) -> Verdict:
    verdict = Verdict()
    executions: dict[tuple[str, str], list[LedgerLine]] = defaultdict(list)
    for line in data.ledger:
        executions[(line.task_id, line.call_id)].append(line)
    journals = {tid: data.journals.get(tid, []) for tid in data.tasks}

    verdict.count("tasks lost", (f"{tid} is not in the store" for tid in data.specs if tid not in data.tasks))
    verdict.count("tasks not finished", _unfinished(data))
    verdict.count("tasks unfinished without a reason", _unexplained(data))
    verdict.count("wrong results", _wrong_results(data))
    verdict.count("fencing tokens two owners committed under", _shared_tokens(data, executions))
    verdict.count("steps committed more than once", _committed_twice(data, journals))
    reruns: list[str] = []
    verdict.count("completed steps executed again", _executed_again(data, journals, executions, reruns))
    verdict.count("committed outputs missing from the ledger", _missing(journals, executions))
    verdict.count("writes accepted from a stale fencing token", _stale_writes(data, journals))
    verdict.count("claims missing from the write audit", _unaudited_claims(data))
    verdict.count("non-idempotent effects run twice", _charged_twice(executions))
    verdict.count(
        "non-idempotent effects applied but neither recorded nor reconciled", _unaccounted(data, journals)
    )
    verdict.count("usage that decreased", _usage_decreased(data))
    frozen = [(stop.worker_id, stop.at, stop.resumed_at) for stop in data.stops]
    verdict.count("task ends a waiter never heard", unheard_ends(data.waits, data.tasks, frozen))
    if data.integrity is not None:
        verdict.count("sqlite integrity_check problems", [] if data.integrity == "ok" else [data.integrity])

    recoveries = _recoveries(data)
    verdict.figures.update(_stops(data))
    first_claims = _first_claim_delays(data)
    verdict.figures.update(
        {
            "kills": len(data.kills),
            "kills that held a task": len(recoveries),
            "waits that heard their task end": sum(wait.heard for wait in data.waits),
            "waits woken by their task's end": woken_by_the_end(data.waits, data.tasks),
            "recovery_p50_s": percentile(recoveries, 50),
            "recovery_p99_s": percentile(recoveries, 99),
            "recovery_max_s": max(recoveries, default=None),
            "first_claim_delay_p50_s": percentile(first_claims, 50),
            "first_claim_delay_p99_s": percentile(first_claims, 99),
            "steps re-run while in flight at an interruption": len(reruns),
            LEDGER_REFUSALS: len(data.refused),
            STORE_REFUSALS: sum(r.operation != "next step" for r in data.refusals),
            WORKER_REFUSALS: sum(r.operation == "next step" for r in data.refusals),
            "writes audited": len(data.writes),
            "head writes audited": sum(w.head is not None for w in data.writes),
            "journal writes audited": len(data.journal_writes),
            "completions committed with others of their claim batch": data.batched,
            "charges reconciled from the ledger": sum(
                1 for j in journals.values() for e in j if e.get("evidence") == "reconciled"
            ),
            "usage samples": len(data.samples),
            "ledger lines": len(data.ledger),
        }
    )
    return verdict


def _unfinished(data: RunData) -> Iterable[str]:
    for tid, rec in sorted(data.tasks.items()):
        if (rec.state, rec.outcome) != (TaskState.TERMINAL, TaskOutcome.COMPLETED):
            yield f"{tid} is {rec.state.value}/{rec.outcome}: {rec.reason}"


def _unexplained(data: RunData) -> Iterable[str]:
    """Tasks that did not complete and say nothing of why: a task may end failed or stay
    unfinished (parked on an effect to reconcile, paused, waiting for a child, held back
    by a limit), but then the store must give a reason."""
    for tid, rec in sorted(data.tasks.items()):
        if rec.outcome is TaskOutcome.COMPLETED:
            continue
        if not any((rec.reason, rec.ambiguous_effect, rec.waiting_for_child, rec.paused, rec.status_note)):
            yield f"{tid} is {rec.state.value}/{rec.outcome} and gives no reason"


def _wrong_results(data: RunData) -> Iterable[str]:
    for tid, spec in sorted(data.specs.items()):
        rec = data.tasks.get(tid)
        if rec is None or rec.outcome is not TaskOutcome.COMPLETED:
            continue
        signal = {"n": spec["n"]} if spec["signal_after"] >= 0 else None  # -1: waits for none
        expected = {"value": spec["start"] + len(spec["plan"]), "signal": signal}
        if rec.result != expected:
            yield f"{tid} returned {rec.result!r}, expected {expected!r}"


def _bodies(journal: list[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    """Journal entries whose output came from a body that wrote a ledger line."""
    for entry in journal:
        if entry["kind"] in ("step", "effect") and entry["status"] == "done":
            yield entry


def _executed_again(
    data: RunData,
    journals: dict[str, list[dict[str, Any]]],
    executions: dict[tuple[str, str], list[LedgerLine]],
    reruns: list[str],
) -> Iterable[str]:
    """A body that ran after its committed execution, or twice under one owner, or for a
    call that no journal records. Earlier executions under older tokens are the step
    that was in flight when its owner was interrupted: allowed, and listed in ``reruns``."""
    recorded: set[tuple[str, str]] = set()
    for tid, journal in sorted(journals.items()):
        for entry in _bodies(journal):
            key = (tid, entry["call_id"])
            recorded.add(key)
            runs = executions.get(key, [])
            ids = [r.run_id for r in runs]
            if entry["output"]["run"] not in ids:
                continue  # reported as missing
            at = ids.index(entry["output"]["run"])
            committed = runs[at]
            for later in runs[at + 1 :]:
                yield (
                    f"{tid} {entry['call_id']} ran again (token {later.token}, pid {later.pid}) "
                    f"after its committed run under token {committed.token}"
                )
            for earlier in runs[:at]:
                if earlier.token >= committed.token:
                    yield f"{tid} {entry['call_id']} ran twice under token {earlier.token}"
                else:
                    reruns.append(f"{tid} {entry['call_id']}")
    for key, runs in sorted(executions.items()):
        finished = data.tasks.get(key[0])
        if key not in recorded and finished is not None and finished.outcome is TaskOutcome.COMPLETED:
            yield f"{key[0]} {key[1]} ran {len(runs)} times but no journal records it"


def _missing(
    journals: dict[str, list[dict[str, Any]]], executions: dict[tuple[str, str], list[LedgerLine]]
) -> Iterable[str]:
    for tid, journal in sorted(journals.items()):
        for entry in _bodies(journal):
            runs = {r.run_id for r in executions.get((tid, entry["call_id"]), [])}
            if entry["output"]["run"] not in runs:
                yield f"{tid} {entry['call_id']}: committed run {entry['output']['run']} is not in the ledger"


def _stale_writes(data: RunData, journals: dict[str, list[dict[str, Any]]]) -> Iterable[str]:
    """Writes the store accepted from an owner whose token was no longer the newest.

    From the audit of accepted writes (every head and journal row included, which the
    history does not show): a body result carries its writer's token (each body returns
    ``ctx.fence``), so one first committed (in a head's tail or in a row, whichever came
    first) while the task's token was a newer grant is a stale write; so is a task write
    that lowered the task's token or revision. Results taken from a reconcile carry the
    token of the run they found, not the writer's, and are skipped. From the history: no
    event under a token after an event under a higher one, but for a ``lease_lost`` report,
    which names the claim its writer lost and so comes after the takeover. From the final journals: no
    entry committed under a lower token than one before it, or above the task's final
    token."""
    for write in data.writes:
        if write.token < write.old_token or write.revision < write.old_revision:
            yield (
                f"{write.task_id} write {write.write_id} at {write.at:.6f} lowered token "
                f"{write.old_token}->{write.token} or revision {write.old_revision}->{write.revision}"
            )
    seen: set[tuple[str, str, str]] = set()  # (task, call id, run id) already committed
    for _at, task_id, token, where, entry in sorted(_committed_entries(data), key=lambda c: c[0]):
        body = (task_id, entry["call_id"], entry["output"]["run"])
        if body in seen:
            continue  # the tail written again, or moved into a row: not a new commit
        seen.add(body)
        evidence = entry.get("evidence")
        if (evidence is None or read_evidence(evidence).ran) and entry["output"]["token"] != token:
            yield (
                f"{task_id} {where} committed {entry['call_id']} run under token "
                f"{entry['output']['token']} while token {token} was granted"
            )
    for tid, events in sorted(data.histories.items()):
        highest = 0
        claims = {(e.fencing_token, e.worker_id) for e in events if e.kind == "claimed"}
        for event in events:
            if event.fencing_token is None:
                continue
            if event.kind == "lease_lost":
                # The report of a worker that lived through losing its lease: written after
                # the loss by design, unfenced, and naming the claim it reports on. Its one
                # effect is to take that claim off the crash-loop count; it must name a
                # claim its writer really held.
                if (event.fencing_token, event.worker_id) not in claims:
                    yield (
                        f"{tid} event {event.event_id} 'lease_lost' by {event.worker_id} reports "
                        f"token {event.fencing_token}, a claim it never held"
                    )
                continue
            if event.fencing_token < highest:
                yield (
                    f"{tid} event {event.event_id} {event.kind!r} by {event.worker_id} under token "
                    f"{event.fencing_token} after token {highest}"
                )
            highest = max(highest, event.fencing_token)
    for tid, journal in sorted(journals.items()):
        highest = 0
        final = data.tasks[tid].fencing_token
        for entry in _bodies(journal):
            token = entry["output"]["token"]
            if token < highest or token > final:
                yield f"{tid} {entry['call_id']}: token {token} committed after {highest} (final {final})"
            highest = max(highest, token)


def _committed_entries(data: RunData) -> Iterable[tuple[float, str, int, str, dict[str, Any]]]:
    """(store time, task, grant, which write, entry) of every body result an audited
    write carried: in a head's tail or as a journal row."""
    for write in data.writes:
        if write.head is not None:
            for tail in from_json(write.head).get("journal_tail", {}).values():
                for entry in _bodies(tail["entries"]):
                    yield write.at, write.task_id, write.token, f"write {write.write_id}", entry
    for written in data.journal_writes:
        for entry in _bodies([from_json(written.entry)]):
            yield written.at, written.task_id, written.token, f"journal write {written.write_id}", entry


def _unaudited_claims(data: RunData) -> Iterable[str]:
    """Claims in the history whose grant the write audit lacks: the audit, and so the
    stale-write check built on it, would have a gap."""
    granted = {(w.task_id, w.token) for w in data.writes if w.token > w.old_token}
    for tid, events in sorted(data.histories.items()):
        for event in events:
            if event.kind == "claimed" and (tid, event.fencing_token) not in granted:
                yield f"{tid} claim of token {event.fencing_token} at {event.at.isoformat()} is not audited"


def _shared_tokens(data: RunData, executions: dict[tuple[str, str], list[LedgerLine]]) -> Iterable[str]:
    """A fencing token is one claim's, so every write under it has one owner: the
    history's events under a token name one worker, and the body results committed under
    it (their run ids, looked up in the ledger) were run by one process."""
    owners: dict[tuple[str, int], set[str]] = defaultdict(set)
    for tid, events in data.histories.items():
        for event in events:
            if event.fencing_token is not None and event.worker_id is not None:
                owners[(tid, event.fencing_token)].add(f"worker {event.worker_id}")
    runs = {
        (line.task_id, line.call_id, line.run_id): line for lines in executions.values() for line in lines
    }
    for _at, tid, _grant, _where, entry in _committed_entries(data):
        line = runs.get((tid, entry["call_id"], entry["output"]["run"]))
        if line is not None and entry.get("evidence") in (None, "ran"):
            owners[(tid, line.token)].add(f"pid {line.pid}")
    for (tid, token), named in sorted(owners.items()):
        workers = {n for n in named if n.startswith("worker ")}
        pids = named - workers
        if len(workers) > 1 or len(pids) > 1:
            yield f"{tid} token {token} committed by {', '.join(sorted(named))}"


def _committed_twice(data: RunData, journals: dict[str, list[dict[str, Any]]]) -> Iterable[str]:
    """Each call of a task is committed once: every write that carried its result (a
    head's tail, a journal row, the final journal) carried the same run. A second run
    committed for one call means a replay did not find the first one's result."""
    committed: dict[tuple[str, str], set[str]] = defaultdict(set)
    for _at, tid, _grant, _where, entry in _committed_entries(data):
        committed[(tid, entry["call_id"])].add(entry["output"]["run"])
    for tid, journal in journals.items():
        for entry in _bodies(journal):
            committed[(tid, entry["call_id"])].add(entry["output"]["run"])
    for (tid, call_id), runs in sorted(committed.items()):
        if len(runs) > 1:
            yield f"{tid} {call_id} committed {len(runs)} runs: {', '.join(sorted(runs))}"


def _unaccounted(data: RunData, journals: dict[str, list[dict[str, Any]]]) -> Iterable[str]:
    """A non-idempotent effect that was applied (its line is in the ledger) must be
    accounted for by its task: recorded as that run or found by a reconcile (the
    journal's entry names the run), or the task parked on it as ambiguous, for a human
    or a reconcile to settle. Otherwise it was applied and forgotten."""
    for line in data.ledger:
        if line.kind != "charge":
            continue
        recorded = {
            entry["output"]["run"]
            for entry in _bodies(journals.get(line.task_id, []))
            if entry["call_id"] == line.call_id
        }
        task = data.tasks.get(line.task_id)
        parked = task is not None and task.ambiguous_effect is not None
        if line.run_id not in recorded and not parked:
            yield f"{line.task_id} {line.call_id} run {line.run_id} (token {line.token}) is in no journal"


def _charged_twice(executions: dict[tuple[str, str], list[LedgerLine]]) -> Iterable[str]:
    for (tid, call_id), runs in sorted(executions.items()):
        charges = [r for r in runs if r.kind == "charge"]
        if len(charges) > 1:
            tokens = [r.token for r in charges]
            yield f"{tid} {call_id} charged {len(charges)} times (tokens {tokens})"


def _usage_decreased(data: RunData) -> Iterable[str]:
    by_task: dict[str, list[Sample]] = defaultdict(list)
    for sample in data.samples:
        by_task[sample.task_id].append(sample)
    for tid, samples in sorted(by_task.items()):
        samples.sort(key=lambda s: s.at)
        final = data.tasks.get(tid)
        for before, after in zip(samples, samples[1:], strict=False):
            if after.revision < before.revision or not after.usage.covers(before.usage):
                yield (
                    f"{tid}: revision {before.revision} usage {before.usage} then "
                    f"revision {after.revision} usage {after.usage}"
                )
        if final is not None and final.checkpoint_json is not None and samples:
            usage = BudgetUsage(**from_json(final.checkpoint_json)["usage"])
            if not usage.covers(samples[-1].usage):
                yield f"{tid}: final usage {usage} is below sampled {samples[-1].usage}"


@attrs.frozen
class _Cycles:
    """Who held which task when, from the history."""

    claims: dict[str, list[tuple[float, str, int]]]  # worker -> (at, task, token) of its claims
    ends: dict[tuple[str, int], float]  # (task, token) -> when that claim's cycle ended
    next_claims: dict[str, list[tuple[float, int]]]  # task -> (at, token) of its claims


def _cycles(data: RunData) -> _Cycles:
    cycles = _Cycles(defaultdict(list), {}, defaultdict(list))
    for tid, events in data.histories.items():
        for event in events:
            at = event.at.timestamp()
            if event.kind == "claimed" and event.worker_id is not None and event.fencing_token is not None:
                cycles.claims[event.worker_id].append((at, tid, event.fencing_token))
                cycles.next_claims[tid].append((at, event.fencing_token))
            elif event.kind in CYCLE_ENDS and event.fencing_token is not None:
                key = (tid, event.fencing_token)
                cycles.ends[key] = min(cycles.ends.get(key, at), at)
    return cycles


def _held_at(cycles: _Cycles, worker_id: str, at: float, until: float) -> tuple[str, int] | None:
    """The task and token ``worker_id`` held at ``at``: its latest claim before then,
    unless that cycle ended by ``until``."""
    before = [c for c in cycles.claims.get(worker_id, []) if c[0] <= at]
    if not before:
        return None
    _at, tid, token = max(before)
    ended = cycles.ends.get((tid, token))
    return None if ended is not None and ended <= until else (tid, token)


def _recoveries(data: RunData) -> list[float]:
    """For each kill of a worker that held a task: seconds from the kill to that task's
    next claim. A worker held a task when its latest claim before the kill had not ended
    (suspend, complete, fail, release, retry) by the time of the kill."""
    cycles = _cycles(data)
    recoveries = []
    for kill in data.kills:
        held = _held_at(cycles, kill.worker_id, kill.at, kill.at)
        if held is None:
            continue
        after = [at for at, _token in cycles.next_claims[held[0]] if at > kill.at]
        if after:
            recoveries.append(min(after) - kill.at)
    return recoveries


def _stops(data: RunData) -> dict[str, int]:
    """What the SIGSTOPs exercised. A stop froze a task when the stopped worker's latest
    claim had not ended by its resume (a write sent just before the stop may still land
    while it is stopped); the task was taken over when another claim of it came while the
    worker was stopped (every stop lasts past the lease), and the late write was refused
    when that worker then logged the loss of that lease."""
    cycles = _cycles(data)
    refused = {(r.task_id, r.token) for r in data.refusals}
    froze = taken = late = 0
    for stop in data.stops:
        held = _held_at(cycles, stop.worker_id, stop.at, stop.resumed_at)
        if held is None:
            continue
        froze += 1
        tid, token = held
        taken += any(stop.at < at <= stop.resumed_at and t > token for at, t in cycles.next_claims[tid])
        late += held in refused
    return {
        "stops": len(data.stops),
        "stops that froze a task": froze,
        "stops whose task was taken over while stopped": taken,
        "stops whose late write was refused after resume": late,
    }


def _first_claim_delays(data: RunData) -> list[float]:
    """Seconds from each task's enqueue to its first claim: the backlog a recovered task
    also waits behind, since claims take ready tasks oldest first."""
    delays = []
    for events in data.histories.values():
        enqueued = next((e.at for e in events if e.kind == "enqueued"), None)
        claimed = next((e.at for e in events if e.kind == "claimed"), None)
        if enqueued is not None and claimed is not None:
            delays.append((claimed - enqueued).total_seconds())
    return delays


def render(verdict: Verdict) -> list[str]:
    lines = [f"invariant {name}: {value}" for name, value in verdict.invariants.items()]
    fig = verdict.figures

    def seconds(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3f}s"

    lines.append(
        f"recovery after kill: p50={seconds(fig['recovery_p50_s'])} p99={seconds(fig['recovery_p99_s'])} "
        f"max={seconds(fig['recovery_max_s'])} (kills {fig['kills']}, of which held a task "
        f"{fig['kills that held a task']})"
    )
    lines.append(
        f"stops: {fig['stops']}, of which froze a task {fig['stops that froze a task']}, whose task was "
        f"taken over while stopped {fig['stops whose task was taken over while stopped']}, whose late "
        f"write was refused after resume {fig['stops whose late write was refused after resume']}"
    )
    lines.append(
        f"fence refusals: by the store {fig[STORE_REFUSALS]}, by the worker's lease check "
        f"{fig[WORKER_REFUSALS]}, by the ledger (stale bodies) {fig[LEDGER_REFUSALS]}"
    )
    lines.append(
        f"info queue delay of first claims (the backlog a recovered task waits behind too): "
        f"p50={seconds(fig['first_claim_delay_p50_s'])} p99={seconds(fig['first_claim_delay_p99_s'])}"
    )
    for name in (
        "steps re-run while in flight at an interruption",
        "writes audited",
        "head writes audited",
        "journal writes audited",
        "completions committed with others of their claim batch",
        "charges reconciled from the ledger",
        "waits that heard their task end",
        "waits woken by their task's end",
        "usage samples",
        "ledger lines",
    ):
        lines.append(f"info {name}: {fig[name]}")
    lines.extend(f"violation {d}" for d in verdict.details)
    return lines
