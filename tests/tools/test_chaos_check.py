"""The chaos tool's checker counts each kind of violation, and only violations: a run
built by hand is clean, then each invariant is broken on purpose, one at a time."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
import pytest

from runifold_sync import BudgetUsage
from runifold_sync.errors import LeaseLostError
from runifold_sync.store import TaskEvent, TaskOutcome, TaskRecord, TaskState

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

from chaos import parse_refusals  # noqa: E402
from chaos_app import LedgerLine  # noqa: E402
from chaos_audit import JournalWrite, Write  # noqa: E402
from chaos_check import Kill, Refusal, RunData, Sample, Stop, Verdict, percentile, verify  # noqa: E402
from chaos_waiters import Wait  # noqa: E402

T0 = 1_700_000_000.0
SPEC = {"n": 7, "start": 10, "plan": ["step", "charge", "notify"], "timer_after": 0, "signal_after": 1}
CALLS = [("work#1", "step", 11), ("charge#1", "effect", 12), ("notify#1", "effect", 13)]


def _at(offset_s: float) -> datetime:
    return datetime.fromtimestamp(T0 + offset_s, UTC)


def _line(call: str, token: int, run: str, value: int, *, kind: str = "step", pid: int = 100) -> LedgerLine:
    return LedgerLine("t1", call, pid, token, run, kind, value, T0)


def _record(*, fencing_token: int = 2, usage_steps: int = 3) -> TaskRecord:
    head = {"usage": {"steps": usage_steps, "cost": 0.0, "elapsed_s": 1.0, "claims": 2}}
    return TaskRecord(
        task_id="t1",
        definition_name="chaos-flow",
        definition_version=1,
        tenant="default",
        input_json=json.dumps(SPEC),
        priority=0,
        state=TaskState.TERMINAL,
        outcome=TaskOutcome.COMPLETED,
        reason=None,
        ambiguous_effect=None,
        ready_at=None,
        worker_id="chaos-1",
        fencing_token=fencing_token,
        lease_expires=None,
        claims_since_progress=0,
        revision=6,
        checkpoint_json=json.dumps(head),
        result_json=json.dumps({"value": 13, "signal": {"n": 7}}),
        created_at=_at(0),
        updated_at=_at(9),
    )


def _event(event_id: int, at_s: float, kind: str, worker: str | None, token: int | None) -> TaskEvent:
    return TaskEvent(event_id, "t1", _at(at_s), kind, worker, token, {})


def _entry(call: str, kind: str, value: int, token: int = 2, run: str | None = None) -> dict[str, Any]:
    output = {"value": value, "run": run or f"r-{call}", "token": token}
    return {"call_id": call, "kind": kind, "status": "done", "output": output}


def _write(
    write_id: int, at_s: float, tokens: tuple[int, int], revisions: tuple[int, int], entries: int | None
) -> Write:
    """An audited update; ``entries``: how many of the journal's entries were stored once
    it was made (None: the update wrote no head)."""
    head = None
    if entries is not None:
        head = json.dumps({"usage": {"steps": entries}})
    state = "terminal" if entries == len(CALLS) else "leased"
    return Write(write_id, "t1", *tokens, *revisions, state, T0 + at_s, head)


def _clean() -> RunData:
    """Token 1 ran work#1 and was killed at 1.5 s before committing it; token 2 took
    over at 3.0 s, ran it again and everything after it once."""
    kind = {"work#1": "step", "charge#1": "charge", "notify#1": "notify"}
    journal = [_entry(c, k, v) for c, k, v in CALLS]
    ledger = [_line("work#1", 1, "r-old", 11)] + [
        _line(c, 2, f"r-{c}", v, kind=kind[c], pid=200) for c, _k, v in CALLS
    ]
    history = [
        _event(1, 0.0, "enqueued", None, None),
        _event(2, 1.0, "claimed", "chaos-0", 1),
        _event(3, 3.0, "claimed", "chaos-1", 2),
        _event(4, 4.0, "completed", "chaos-1", 2),
    ]
    samples = [
        Sample(T0 + 1, "t1", 1, BudgetUsage(steps=1, elapsed_s=0.5, claims=1)),
        Sample(T0 + 3.5, "t1", 3, BudgetUsage(steps=2, elapsed_s=0.7, claims=2)),
    ]
    return RunData(
        specs={"t1": SPEC},
        tasks={"t1": _record()},
        journals={"t1": journal},
        histories={"t1": history},
        ledger=ledger,
        refused=[],
        samples=samples,
        kills=[Kill(T0 + 1.5, 100, "chaos-0")],
        integrity="ok",
        # One wait timed out before the task ended (at 9 s), the next one heard its end.
        waits=[Wait("t1", T0, T0 + 8.0, False), Wait("t1", T0 + 8.0, T0 + 9.1, True)],
        writes=[
            _write(1, 1.0, (0, 1), (0, 0), None),  # claims
            _write(2, 3.0, (1, 2), (0, 0), None),
            _write(3, 3.1, (2, 2), (0, 0), None),  # a heartbeat
            _write(4, 3.5, (2, 2), (0, 1), 1),
            _write(5, 3.8, (2, 2), (1, 2), 2),
            _write(6, 4.0, (2, 2), (2, 3), 3),  # the completion
        ],
        journal_writes=[
            JournalWrite(n, "t1", 2, T0 + 3.4 + n / 10, json.dumps(entry))
            for n, entry in enumerate(journal, 1)
        ],
    )


def _journal(data: RunData) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads(json.dumps(data.journals["t1"]))  # a copy to change
    return entries


def _nonzero(verdict: Verdict) -> dict[str, int]:
    return {name: n for name, n in verdict.invariants.items() if n}


def test_a_clean_run_has_no_violations_and_counts_the_in_flight_rerun_and_the_recovery() -> None:
    verdict = verify(_clean())
    assert verdict.ok, verdict.details
    figures = verdict.figures
    assert (figures["writes audited"], figures["head writes audited"], figures["journal writes audited"]) == (
        6,
        3,
        3,
    )
    assert verdict.figures["steps re-run while in flight at an interruption"] == 1
    assert verdict.figures["kills that held a task"] == 1
    assert verdict.figures["recovery_p50_s"] == pytest.approx(1.5)


def test_a_step_that_runs_after_its_committed_run_is_executed_again() -> None:
    data = _clean()
    late = _line("notify#1", 2, "r-late", 13, kind="notify")
    verdict = verify(attrs.evolve(data, ledger=[*data.ledger, late]))
    assert _nonzero(verdict) == {"completed steps executed again": 1}


def test_a_step_run_twice_under_one_token_before_its_commit_is_executed_again() -> None:
    data = _clean()
    twice = _line("work#1", 2, "r-twice", 11)
    ledger = [*data.ledger[:1], twice, *data.ledger[1:]]
    verdict = verify(attrs.evolve(data, ledger=ledger))
    assert _nonzero(verdict) == {"completed steps executed again": 1}


def test_a_second_charge_counts_as_a_non_idempotent_effect_run_twice() -> None:
    data = _clean()
    again = _line("charge#1", 2, "r-again", 12, kind="charge")
    verdict = verify(attrs.evolve(data, ledger=[*data.ledger, again]))
    assert _nonzero(verdict) == {
        "completed steps executed again": 1,
        "non-idempotent effects run twice": 1,
        "non-idempotent effects applied but neither recorded nor reconciled": 1,
    }


def test_an_event_under_an_older_token_after_a_newer_one_is_a_stale_write() -> None:
    data = _clean()
    history = [*data.histories["t1"], _event(5, 5.0, "failed", "chaos-0", 1)]
    verdict = verify(attrs.evolve(data, histories={"t1": history}))
    assert _nonzero(verdict) == {"writes accepted from a stale fencing token": 1}


def test_the_old_owners_lease_lost_report_after_the_takeover_is_not_a_stale_write() -> None:
    """The worker cut off from the store reports its lost claim once it reaches the store
    again, after the takeover; the report names the claim it lost, its writer must have
    held it."""
    data = _clean()
    report = _event(5, 5.0, "lease_lost", "chaos-0", 1)
    verdict = verify(attrs.evolve(data, histories={"t1": [*data.histories["t1"], report]}))
    assert _nonzero(verdict) == {}
    forged = _event(5, 5.0, "lease_lost", "chaos-1", 3)
    verdict = verify(attrs.evolve(data, histories={"t1": [*data.histories["t1"], forged]}))
    assert _nonzero(verdict) == {"writes accepted from a stale fencing token": 1}
    assert verdict.details == [
        "writes accepted from a stale fencing token: t1 event 5 'lease_lost' by chaos-1 reports "
        "token 3, a claim it never held"
    ]


def test_a_checkpoint_entry_committed_under_an_older_token_is_a_stale_write() -> None:
    data = _clean()
    journal = _journal(data)
    journal[2]["output"]["token"] = 1
    stale_ledger = [ln._replace(token=1) if ln.call_id == "notify#1" else ln for ln in data.ledger]
    ledger = [ln for ln in stale_ledger if ln.call_id != "notify#1"] + [
        ln for ln in stale_ledger if ln.call_id == "notify#1"
    ]
    verdict = verify(attrs.evolve(data, journals={"t1": journal}, ledger=ledger))
    # The final journal has it: an entry after a token-2 entry.
    assert _nonzero(verdict) == {"writes accepted from a stale fencing token": 1}


def test_a_commit_by_the_old_owner_after_the_new_claim_is_a_stale_write_though_overwritten_later() -> None:
    """The old owner (token 1) commits its run of work#1 after token 2 was granted; the
    new owner's later commits replace it, so only the audit of accepted writes shows it."""
    data = _clean()
    stale = JournalWrite(
        30, "t1", 2, T0 + 3.2, json.dumps(_entry("work#1", "step", 11, token=1, run="r-old"))
    )
    verdict = verify(attrs.evolve(data, journal_writes=[stale, *data.journal_writes]))
    assert _nonzero(verdict) == {
        "writes accepted from a stale fencing token": 1,
        "steps committed more than once": 1,
    }
    assert verdict.details == [
        "steps committed more than once: t1 work#1 committed 2 runs: r-old, r-work#1",
        "writes accepted from a stale fencing token: t1 journal write 30 committed "
        "work#1 run under token 1 while token 2 was granted",
    ]


def test_an_entry_first_committed_in_a_heads_tail_counts_there_and_not_where_it_moves_later() -> None:
    """A stale body result in a head's tail is a stale write; the same result moved into a
    row later under a newer grant is not a second one, and a fresh result that first
    reached the store in a tail under its own grant is no violation at all."""
    data = _clean()
    old = _entry("work#1", "step", 11, token=1, run="r-old")
    tail = json.dumps({"journal_tail": {"": {"start": 0, "entries": [old]}}})
    stale = Write(31, "t1", 2, 2, 1, 2, "leased", T0 + 3.3, tail)
    moved = JournalWrite(32, "t1", 3, T0 + 3.35, json.dumps(old))
    verdict = verify(
        attrs.evolve(data, writes=[*data.writes, stale], journal_writes=[moved, *data.journal_writes])
    )
    assert verdict.details == [
        "steps committed more than once: t1 work#1 committed 2 runs: r-old, r-work#1",
        "writes accepted from a stale fencing token: t1 write 31 committed work#1 run under token 1 "
        "while token 2 was granted",
    ]
    fresh = _entry("work#1", "step", 11, token=2)  # the committed run, first in a tail
    in_tail = Write(
        33,
        "t1",
        2,
        2,
        1,
        2,
        "leased",
        T0 + 3.3,
        json.dumps({"journal_tail": {"": {"start": 0, "entries": [fresh]}}}),
    )
    row = JournalWrite(34, "t1", 5, T0 + 3.9, json.dumps(fresh))  # moved under a later grant
    assert _nonzero(verify(attrs.evolve(data, writes=[*data.writes, in_tail], journal_writes=[row]))) == {}


def test_a_write_that_lowers_the_token_or_the_revision_is_a_stale_write() -> None:
    data = _clean()
    lowered = Write(40, "t1", 2, 1, 3, 3, "leased", T0 + 4.5, None)
    rewound = Write(41, "t1", 2, 2, 3, 2, "leased", T0 + 4.6, None)
    verdict = verify(attrs.evolve(data, writes=[*data.writes, lowered, rewound]))
    assert _nonzero(verdict) == {"writes accepted from a stale fencing token": 2}


def test_a_claim_the_write_audit_lacks_is_counted() -> None:
    data = _clean()
    verdict = verify(attrs.evolve(data, writes=[w for w in data.writes if w.token == w.old_token]))
    assert _nonzero(verdict) == {"claims missing from the write audit": 2}


def test_usage_that_shrinks_between_samples_is_counted() -> None:
    data = _clean()
    shrunk = Sample(T0 + 3.8, "t1", 4, BudgetUsage(steps=1, elapsed_s=0.9, claims=2))
    verdict = verify(attrs.evolve(data, samples=[*data.samples, shrunk]))
    assert _nonzero(verdict) == {"usage that decreased": 1}


def test_a_wait_that_gives_up_long_after_its_task_ended_is_an_end_never_heard() -> None:
    data = _clean()  # t1 ended at 9 s
    waits = [
        Wait("t1", T0 + 10.0, T0 + 20.0, False),  # began after the end and timed out
        Wait("t1", T0 + 5.0, T0 + 16.0, False),  # still blocked when the run ended
        Wait("t1", T0 + 2.0, T0 + 12.0, False),  # gave up 3 s after the end: within 5 s
    ]
    verdict = verify(attrs.evolve(data, waits=[*data.waits, *waits]))
    assert _nonzero(verdict) == {"task ends a waiter never heard": 2}
    assert verdict.figures["waits that heard their task end"] == 1
    assert verdict.figures["waits woken by their task's end"] == 1  # began at 8 s, before the end


def test_an_end_whose_worker_was_stopped_before_its_commit_is_heard_from_the_resume() -> None:
    """A worker SIGSTOPped between its ending statement (which stamps the end) and its
    COMMIT makes the end visible only at the SIGCONT, so a wait before that is no miss."""
    data = _clean()  # t1 ended at 9 s, by chaos-1
    waits = [*data.waits, Wait("t1", T0 + 10.0, T0 + 20.0, False)]
    assert _nonzero(verify(attrs.evolve(data, waits=waits))) == {"task ends a waiter never heard": 1}
    frozen = [Stop(T0 + 9.05, T0 + 19.0, 200, "chaos-1")]  # stopped with the end uncommitted
    assert _nonzero(verify(attrs.evolve(data, waits=waits, stops=frozen))) == {}
    elsewhere = [Stop(T0 + 9.05, T0 + 19.0, 100, "chaos-0")]  # another worker's stop changes nothing
    assert _nonzero(verify(attrs.evolve(data, waits=waits, stops=elsewhere))) == {
        "task ends a waiter never heard": 1
    }


def test_a_missing_task_a_failed_task_and_a_wrong_result_are_each_counted() -> None:
    data = _clean()
    other = {**SPEC, "n": 8}
    failed = attrs.evolve(data.tasks["t1"], outcome=TaskOutcome.FAILED, reason="ambiguous")
    assert _nonzero(verify(attrs.evolve(data, specs={"t1": SPEC, "t2": other}))) == {"tasks lost": 1}
    assert _nonzero(verify(attrs.evolve(data, tasks={"t1": failed}))) == {"tasks not finished": 1}
    wrong = attrs.evolve(data.tasks["t1"], result_json=json.dumps({"value": 13, "signal": None}))
    assert _nonzero(verify(attrs.evolve(data, tasks={"t1": wrong}))) == {"wrong results": 1}


def test_a_committed_output_absent_from_the_ledger_and_a_bad_integrity_check_are_counted() -> None:
    data = _clean()
    ledger = [ln for ln in data.ledger if ln.run_id != "r-notify#1"]
    assert _nonzero(verify(attrs.evolve(data, ledger=ledger))) == {
        "committed outputs missing from the ledger": 1
    }
    bad = verify(attrs.evolve(data, integrity="row 3 missing from index x"))
    assert _nonzero(bad) == {"sqlite integrity_check problems": 1}


def test_a_kill_of_a_worker_whose_cycle_had_ended_is_not_a_recovery() -> None:
    data = _clean()
    verdict = verify(attrs.evolve(data, kills=[Kill(T0 + 4.5, 200, "chaos-1")]))
    assert verdict.figures["kills that held a task"] == 0
    assert verdict.figures["recovery_p50_s"] is None


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 50) is None


def test_a_stop_whose_task_was_claimed_by_another_worker_before_the_resume_was_taken_over() -> None:
    """chaos-0 held token 1 when stopped at 1.5 s; chaos-1 claimed token 2 at 3.0 s,
    before the resume at 3.5 s, and chaos-0 then logged its refused step. A stop of
    chaos-1 after its completion froze no task."""
    data = _clean()
    stops = [Stop(T0 + 1.5, T0 + 3.5, 100, "chaos-0"), Stop(T0 + 4.5, T0 + 7.0, 200, "chaos-1")]
    refusals = [Refusal("t1", 1, "next step"), Refusal("t1", 1, "checkpoint commit")]
    verdict = verify(attrs.evolve(data, kills=[], stops=stops, refusals=refusals))
    assert verdict.ok
    figures = verdict.figures
    assert (
        figures["stops"],
        figures["stops that froze a task"],
        figures["stops whose task was taken over while stopped"],
        figures["stops whose late write was refused after resume"],
        figures["bodies refused by the worker's lease check"],
        figures["writes refused by the store's fence"],
    ) == (2, 1, 1, 1, 1, 1)


def test_a_stop_resumed_before_anyone_claimed_its_task_was_not_taken_over() -> None:
    data = _clean()
    verdict = verify(attrs.evolve(data, kills=[], stops=[Stop(T0 + 1.5, T0 + 2.5, 100, "chaos-0")]))
    assert verdict.figures["stops that froze a task"] == 1
    assert verdict.figures["stops whose task was taken over while stopped"] == 0
    assert verdict.figures["stops whose late write was refused after resume"] == 0


def test_the_lease_losses_workers_log_are_read_back_with_their_operation(tmp_path: Path) -> None:
    log = tmp_path / "supervisor.err"
    lines = [str(LeaseLostError("chaos-00004", 3, "next step")), "some other warning"]
    lines.append(str(LeaseLostError("chaos-00012", 1, "checkpoint commit")))
    log.write_text("\n".join(lines) + "\n")
    assert parse_refusals(log) == [
        Refusal("chaos-00004", 3, "next step"),
        Refusal("chaos-00012", 1, "checkpoint commit"),
    ]
    assert parse_refusals(tmp_path / "absent.err") == []


# The four properties a chaos history must have, each planted broken: the checker must
# be able to fail on each.


def test_two_owners_committing_under_one_token_are_caught_in_the_history_and_the_ledger() -> None:
    data = _clean()  # chaos-1 holds token 2
    history = [*data.histories["t1"][:3], _event(5, 3.6, "suspended", "chaos-0", 2), data.histories["t1"][3]]
    verdict = verify(attrs.evolve(data, histories={"t1": history}))
    assert _nonzero(verdict) == {"fencing tokens two owners committed under": 1}
    assert verdict.details == [
        "fencing tokens two owners committed under: t1 token 2 committed by pid 200, worker chaos-0, "
        "worker chaos-1"
    ]
    # notify#1's committed run came from another process under the same token.
    ledger = [ln._replace(pid=300) if ln.call_id == "notify#1" else ln for ln in data.ledger]
    assert _nonzero(verify(attrs.evolve(data, ledger=ledger))) == {
        "fencing tokens two owners committed under": 1
    }


def test_a_second_run_committed_for_one_step_is_caught() -> None:
    data = _clean()
    second = JournalWrite(50, "t1", 2, T0 + 3.45, json.dumps(_entry("work#1", "step", 11, run="r-second")))
    verdict = verify(attrs.evolve(data, journal_writes=[*data.journal_writes, second]))
    assert _nonzero(verdict) == {"steps committed more than once": 1}
    assert verdict.details == [
        "steps committed more than once: t1 work#1 committed 2 runs: r-second, r-work#1"
    ]


def test_a_charge_applied_and_forgotten_is_caught_unless_the_task_parked_on_it() -> None:
    """The charge ran (its ledger line) but its result was never committed and the task
    failed without naming it: applied and forgotten. Parked as ambiguous, it was sent
    to reconcile, which is allowed."""
    data = _clean()
    journal = [entry for entry in _journal(data) if entry["call_id"] != "charge#1"]
    failed = attrs.evolve(data.tasks["t1"], outcome=TaskOutcome.FAILED, reason="attempts exhausted")
    verdict = verify(attrs.evolve(data, tasks={"t1": failed}, journals={"t1": journal}, journal_writes=[]))
    assert _nonzero(verdict) == {
        "tasks not finished": 1,
        "non-idempotent effects applied but neither recorded nor reconciled": 1,
    }
    parked = attrs.evolve(
        data.tasks["t1"],
        state=TaskState.WAITING,
        outcome=None,
        ambiguous_effect="charge#1",
        reason="ambiguous",
    )
    verdict = verify(attrs.evolve(data, tasks={"t1": parked}, journals={"t1": journal}, journal_writes=[]))
    assert _nonzero(verdict) == {"tasks not finished": 1}


def test_a_task_left_unfinished_without_a_reason_is_caught() -> None:
    data = _clean()
    stuck = attrs.evolve(data.tasks["t1"], state=TaskState.LEASED, outcome=None, reason=None)
    assert _nonzero(verify(attrs.evolve(data, tasks={"t1": stuck}))) == {
        "tasks not finished": 1,
        "tasks unfinished without a reason": 1,
    }
    waiting = attrs.evolve(stuck, state=TaskState.WAITING, reason="waiting for signal 'go'")
    assert _nonzero(verify(attrs.evolve(data, tasks={"t1": waiting}))) == {"tasks not finished": 1}
