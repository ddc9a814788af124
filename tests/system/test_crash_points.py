"""The crash-point matrix: a worker process killed (SIGKILL) at every named crash point,
on both stores, and what the checkpoint holds at that moment and what happens after.

Each case runs ``tests.system.crash_app`` with ``RUNIFOLD_CRASH_AT`` set (some cases
crash two processes one after the other), checks that the process died of SIGKILL at
that point and what the checkpoint journal then records, moves store time past the dead
worker's lease, and lets a worker in this process finish the task. The ledger the bodies
write outside the store says which bodies ran again:

- a step is re-run only when the crash came after its body started and before the
  commit recording it; after that commit it never runs again;
- an idempotent effect interrupted between its intent and its result commit runs again
  (same idempotency key); one interrupted before its body ran, runs once;
- a non-idempotent effect with no reconcile, interrupted after its intent, fails the
  task as ambiguous (recoverable) whether or not its body ran; ``resolve_effect`` then
  settles it: not applied runs it (once in all), applied uses the given result;
- a non-idempotent effect with a reconcile asks it: not applied runs it once, applied
  takes the result from the evidence without running it again;
- crashes around heartbeats, the claim, a signal consumption, an event's commit
  (``ctx.set_event``: unpublished before it, published after, and published exactly
  once in the end), the suspend for a timer and the final complete or fail lose only
  the step in flight, if any;
- so do crashes around the other writes that end a claim: a failed step's retry (the
  failure is counted only once the retry is stored), the release after a step slice or
  for a definition this worker lacks, the acknowledgement of a cancel (the task ends
  cancelled with no body run), and the hand-back of a task claimed ahead, on close or by
  the heartbeat thread; a crash around a held task's heartbeat leaves it to be claimed
  again once its lease runs out.

The points around a schedule's tick (``before_tick``, ``after_tick``), those of
completions held for a claim batch's one commit (``completion_held``, the
``complete_batch`` transition) and those of a pool's hand-back of a dead worker's leases
(the ``hand_back_dead`` transition) have tables of their own,
``test_schedule_crash_points``, ``test_held_crash_points`` and ``test_pool_crash_points``,
which the coverage check below counts too.
"""

from __future__ import annotations

import ast
import json
import os
import signal
from collections import Counter
from datetime import timedelta
from pathlib import Path

import attrs
import pytest

from runifold_sync import WorkerId, WorkflowStore, WorkflowTask, WorkflowWorker
from runifold_sync.errors import InvalidArgument
from runifold_sync.model import crashpoints
from runifold_sync.store import TaskOutcome, TaskState
from tests.support import processes
from tests.support.backends import Backend
from tests.support.journals import entries

from . import crash_app
from .test_flow_crash_points import BULK_CASE, FLOW_CASES
from .test_held_crash_points import HELD_CASES
from .test_pool_crash_points import POOL_CASES
from .test_repair_crash_points import REPAIR_CASES
from .test_schedule_crash_points import SCHEDULE_CASES

ROOT = Path(__file__).resolve().parents[2]
TASK = "t1"
HELD = "t2"  # claimed ahead by the crashing worker in the cases that enqueue it
CHARGE_KEY = f"{TASK}/charge#1"


def result_of(task_id: str, run: int = 1) -> dict[str, object]:
    """What the flow returns; from run 2 on, its effects' keys name the run."""
    keys = task_id if run == 1 else f"{task_id}/run{run}"
    return {
        "charge": f"ch-{keys}/charge#1",
        "shipment": f"shipped {keys}/ship#1",
        "approval": {"ok": True},
        "end": "done",
    }


RESULT = result_of(TASK)

P, N, C, S = "prepare#1:done", "notify#1:done", "charge#1:done", "ship#1:done"
G, T, F = "signal:go#1:done", "timer#1:done", "finish#1:done"
N_INTENT, C_INTENT, S_INTENT = "notify#1:intent", "charge#1:intent", "ship#1:intent"


@attrs.frozen
class Case:
    crash: tuple[str, ...]  # RUNIFOLD_CRASH_AT of each process, run one after the other
    journal: tuple[str, ...]  # "call id:status" in the checkpoint after the crashes
    ran_twice: tuple[str, ...] = ()  # bodies that ran twice in all; the others ran once
    state: TaskState = TaskState.LEASED  # right after the crashes
    ambiguous: bool | None = None  # the task fails ambiguous; resolved applied (True) or not
    evidence: str | None = None  # the ship effect's evidence in the final checkpoint
    args: tuple[str, ...] = ()  # crash_app options of the crashing processes
    env: tuple[tuple[str, str], ...] = ()  # crash_app variables of the crashing processes
    held: TaskState | None = None  # a second task, claimed ahead: its state after the crashes
    cancel: bool = False  # cancel requested after the first crash: ends cancelled, no body ran
    # The crash is at the first heartbeat of a held task, which may come before or after
    # the running task's first body began: that body runs again iff it had begun.
    racy_first_body: bool = False
    order: str = "order-1"  # the task's input (crash_app.RENEW continues it as new once)
    more_runs: tuple[tuple[str, int], ...] = ()  # bodies that ran more than twice: (body, runs)
    published: tuple[str, ...] | None = None  # the keys of the events stored after the crashes


BATCH = ("--claim-batch", "2")
FLAKY = ((crash_app.FLAKY_ENV, "1"),)
# Long enough that the heartbeat thread hands the held task back (half the lease).
SLOW = ((crash_app.SLOW_ENV, str(crash_app.LEASE.seconds * 0.6)),)


CASES = {
    "after_claim": Case(("after_claim",), ()),
    "before_step": Case(("before_step:prepare#1",), ()),
    "after_step": Case(("after_step:prepare#1",), (), ran_twice=("prepare",)),
    "before_step_commit": Case(("before_commit:prepare#1",), (), ran_twice=("prepare",)),
    "after_step_commit": Case(("after_commit:prepare#1",), (P,)),
    "before_heartbeat": Case(("before_heartbeat",), (), ran_twice=("prepare",)),
    "after_heartbeat": Case(("after_heartbeat",), (), ran_twice=("prepare",)),
    "before_intent_commit": Case(("before_commit:notify#1:intent",), (P,)),
    "after_intent_commit": Case(("after_commit:notify#1:intent",), (P, N_INTENT)),
    "before_idempotent_effect": Case(("before_effect:notify#1",), (P, N_INTENT)),
    "after_idempotent_effect": Case(("after_effect:notify#1",), (P, N_INTENT), ran_twice=("notify",)),
    "before_idempotent_result_commit": Case(
        ("before_commit:notify#1",), (P, N_INTENT), ran_twice=("notify",)
    ),
    "after_idempotent_result_commit": Case(("after_commit:notify#1",), (P, N)),
    "before_effect_no_reconcile": Case(("before_effect:charge#1",), (P, N, C_INTENT), ambiguous=False),
    "after_effect_no_reconcile": Case(("after_effect:charge#1",), (P, N, C_INTENT), ambiguous=True),
    "before_result_commit_no_reconcile": Case(("before_commit:charge#1",), (P, N, C_INTENT), ambiguous=True),
    "after_result_commit_no_reconcile": Case(("after_commit:charge#1",), (P, N, C)),
    "before_effect_reconciled": Case(
        ("before_effect:ship#1",), (P, N, C, S_INTENT), evidence="re-run as not applied, reconciled"
    ),
    "after_effect_reconciled": Case(("after_effect:ship#1",), (P, N, C, S_INTENT), evidence="reconciled"),
    "before_signal_commit": Case(("before_commit:signal:go#1",), (P, N, C, S)),
    "after_signal_commit": Case(("after_commit:signal:go#1",), (P, N, C, S, G)),
    # The event rides a commit of its own, made before set_event returns: a crash before
    # it publishes nothing (the resumed run publishes it), one after it leaves it stored
    # and the resumed run, at the end of its journal, writes the same value again.
    "before_event_commit": Case(("before_commit:event:approval",), (P, N, C, S, G), published=()),
    "after_event_commit": Case(("after_commit:event:approval",), (P, N, C, S, G), published=("approval",)),
    "before_suspend": Case(("before_transition:suspend",), (P, N, C, S, G)),
    "after_suspend": Case(
        ("after_transition:suspend",), (P, N, C, S, G, "timer#1:pending"), state=TaskState.WAITING
    ),
    # The last step's result is committed with the completion, so a crash before it
    # leaves finish uncommitted (it runs again) and the due timer as last committed.
    "before_complete": Case(
        ("before_transition:complete",), (P, N, C, S, G, "timer#1:pending"), ran_twice=("finish",)
    ),
    "after_complete": Case(("after_transition:complete",), (P, N, C, S, G, T, F), state=TaskState.TERMINAL),
    "before_fail": Case(
        ("after_effect:charge#1", "before_transition:fail"), (P, N, C_INTENT), ambiguous=True
    ),
    "after_fail": Case(
        ("after_effect:charge#1", "after_transition:fail"),
        (P, N, C_INTENT),
        state=TaskState.TERMINAL,
        ambiguous=True,
    ),
    "before_claim": Case(("before_claim",), (), state=TaskState.QUEUED),
    # Run 1 is prepare alone, whose result rides the continue transition: a crash before
    # it runs run 1 again (prepare twice), then run 2 (a third time); after it, only run 2.
    "before_continue": Case(
        ("before_transition:continue",), (), order=f"{crash_app.RENEW}order-1", more_runs=(("prepare", 3),)
    ),
    "after_continue": Case(
        ("after_transition:continue",),
        (),
        ran_twice=("prepare",),
        state=TaskState.QUEUED,
        order=f"{crash_app.RENEW}order-1",
    ),
    "before_retry": Case(("before_transition:retry",), (), ran_twice=("prepare",), env=FLAKY),
    "after_retry": Case(
        ("after_transition:retry",), (), ran_twice=("prepare",), state=TaskState.QUEUED, env=FLAKY
    ),
    "before_yield": Case(("before_transition:yield",), (P,), args=("--max-steps", "1")),
    "after_yield": Case(("after_transition:yield",), (P,), state=TaskState.QUEUED, args=("--max-steps", "1")),
    "before_unavailable_release": Case(("before_transition:unavailable",), (), args=("--no-definitions",)),
    "after_unavailable_release": Case(
        ("after_transition:unavailable",), (), state=TaskState.QUEUED, args=("--no-definitions",)
    ),
    "before_cancel": Case(("after_claim", "before_transition:cancel"), (), cancel=True),
    "after_cancel": Case(
        ("after_claim", "after_transition:cancel"), (), state=TaskState.CANCELLED, cancel=True
    ),
    "before_held_heartbeat": Case(
        (f"before_heartbeat:{HELD}",), (), args=BATCH, held=TaskState.LEASED, racy_first_body=True
    ),
    "after_held_heartbeat": Case(
        (f"after_heartbeat:{HELD}",), (), args=BATCH, held=TaskState.LEASED, racy_first_body=True
    ),
    # --cycles 1: the worker stops after the first task suspends, handing the second back.
    "before_hand_back_on_close": Case(
        ("before_transition:hand_back",),
        (P, N, C, S, G, "timer#1:pending"),
        state=TaskState.WAITING,
        args=(*BATCH, "--cycles", "1"),
        held=TaskState.LEASED,
    ),
    "after_hand_back_on_close": Case(
        ("after_transition:hand_back",),
        (P, N, C, S, G, "timer#1:pending"),
        state=TaskState.WAITING,
        args=(*BATCH, "--cycles", "1"),
        held=TaskState.QUEUED,
    ),
    "before_hand_back_by_heartbeat": Case(
        ("before_transition:hand_back",),
        (),
        ran_twice=("prepare",),
        args=BATCH,
        env=SLOW,
        held=TaskState.LEASED,
    ),
    "after_hand_back_by_heartbeat": Case(
        ("after_transition:hand_back",),
        (),
        ran_twice=("prepare",),
        args=BATCH,
        env=SLOW,
        held=TaskState.QUEUED,
    ),
}


TRANSITION_KINDS = (
    "complete",
    "suspend",
    "fail",
    "retry",
    "continue",
    "cancel",
    "yield",
    "unavailable",
    "hand_back",
    "complete_batch",
    "hand_back_dead",
)


def _transition_hooks() -> set[tuple[str, str]]:
    """(point, kind) of every transition crash point in the library's source: the writes
    that end a claim, as the code has them. A ``crashpoints.transition("<kind>")`` block
    brackets its write with both points; a ``crashpoints.reached("..._transition",
    "<kind>")`` call is the one point it names. Only the helper's own two calls, in
    ``crashpoints.py``, pass the kind on from a variable."""
    hooks = set()
    helper = ROOT / "runifold_sync" / "model" / "crashpoints.py"
    for path in (ROOT / "runifold_sync").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            called, args = ast.unparse(node.func), node.args
            if called in ("transition", "crashpoints.transition"):
                assert len(args) == 1 and isinstance(args[0], ast.Constant), (
                    f"{path}: a transition kind must be a literal"
                )
                hooks |= {(f"{when}_transition", args[0].value) for when in ("before", "after")}
            elif called.endswith("reached") and len(args) == 2 and isinstance(args[0], ast.Constant):
                point = args[0].value
                if point in ("before_transition", "after_transition"):
                    if path == helper and ast.unparse(args[1]) == "self.kind":
                        continue  # the helper's own points, counted at each block above
                    assert isinstance(args[1], ast.Constant), f"{path}: a transition kind must be a literal"
                    hooks.add((point, args[1].value))
    return hooks


def test_every_crash_point_and_every_transition_kind_before_and_after_is_covered_by_the_matrix() -> None:
    armed = [spec.partition(":") for case in CASES.values() for spec in case.crash]
    armed += [case.crash.partition(":") for case in HELD_CASES.values()]  # their own table
    armed += [case.crash.partition(":") for case in POOL_CASES.values()]  # a pool's hand-back
    armed += [case.partition(":") for case in FLOW_CASES.values()]  # an enqueue's flow write
    armed.append(BULK_CASE.partition(":"))  # a batch's tasks and events written together
    ticks = {case.crash.partition(":")[0] for case in SCHEDULE_CASES.values()}  # theirs too
    repairs = {case.crash.partition(":")[0] for case in REPAIR_CASES.values()}  # the operator's
    assert {point for point, _, _ in armed} | ticks | repairs == set(crashpoints.POINTS)
    # A point name alone would pass with one transition kind covered: each kind must be
    # crashed both before and after its write.
    expected = {(f"{when}_transition", kind) for when in ("before", "after") for kind in TRANSITION_KINDS}
    assert _transition_hooks() == expected
    assert {(point, kind) for point, _, kind in armed if point.endswith("_transition")} == expected


def test_crash_spec_parsing() -> None:
    assert crashpoints.parse("") == {}
    assert crashpoints.parse("after_claim, before_commit:reserve#1,before_commit:x#1:intent") == {
        "after_claim": None,
        "before_commit": frozenset({"reserve#1", "x#1:intent"}),
    }
    assert crashpoints.parse("after_commit:a#1,after_commit") == {"after_commit": None}
    assert crashpoints.parse("before_claim") == {"before_claim": None}
    with pytest.raises(InvalidArgument, match="unknown crash point 'before_lunch'"):
        crashpoints.parse("before_lunch")


def test_an_unset_variable_arms_nothing() -> None:
    assert os.environ.get(crashpoints.ENV_VAR) is None
    assert crashpoints.ARMED == {}
    assert crashpoints.PAUSE_UNTIL is None  # an armed point kills unless told to pause


def test_reading_the_environment_again_arms_what_it_names_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a child forked from a parent that imported the package before the variable
    was set relies on (``tests/support/zygote.py``)."""
    monkeypatch.setenv(crashpoints.ENV_VAR, "after_claim,before_commit:reserve#1")
    monkeypatch.setenv(crashpoints.PAUSE_ENV_VAR, "/tmp/go")
    try:
        crashpoints.read_environment()
        assert crashpoints.ARMED == {"after_claim": None, "before_commit": frozenset({"reserve#1"})}
        assert crashpoints.PAUSE_UNTIL == "/tmp/go"
    finally:
        monkeypatch.undo()
        crashpoints.read_environment()
    assert (crashpoints.ARMED, crashpoints.PAUSE_UNTIL) == ({}, None)


def _crash(backend: Backend, ledger: Path, spec: str, case: Case) -> None:
    env = dict(os.environ, RUNIFOLD_CRASH_AT=spec, **dict(case.env))
    args = ["--url", backend.url, "--ledger", str(ledger), "--task", TASK, *case.args]
    proc = processes.run("tests.system.crash_app", *args, env=env, timeout_s=60)
    point, _, subject = spec.partition(":")
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    assert f"runifold crash point {point}:{subject}" in proc.stderr, proc.stderr


def _journal(store: WorkflowStore, task_id: str) -> tuple[str, ...]:
    return tuple(f"{e['call_id']}:{e['status']}" for e in entries(store, task_id))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(CASES))
def test_crash_point(name: str, backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    case = CASES[name]
    ledger = tmp_path / "ledger.txt"
    monkeypatch.setenv(crash_app.LEDGER_ENV, str(ledger))
    store = backend.open()
    tasks = [TASK] if case.held is None else [TASK, HELD]
    for priority, task_id in enumerate(reversed(tasks)):  # the first is claimed first
        order = case.order if task_id == TASK else "order-1"
        store.enqueue(WorkflowTask.new("crashy", 1, order, checkpoint_id=task_id, priority=priority))
        store.send_signal(task_id, "go", {"ok": True}, signal_id="s1", sender="test")

    offset = timedelta(0)
    for spec in case.crash:
        _crash(backend, ledger, spec, case)
        if case.cancel and offset == timedelta(0):
            assert store.cancel(TASK, actor="test", reason="stop") is TaskState.LEASED
        offset += crash_app.LEASE.value * 3  # past the dead worker's lease, heartbeats included
        store.set_clock_offset(offset)
    record = store.get_task(TASK)
    assert _journal(store, TASK) == case.journal
    assert record.state is case.state
    if case.published is not None:
        assert tuple(e.key for e in store.published_events(TASK)) == case.published
    if case.held is not None:
        held = store.get_task(HELD)
        assert (held.state, _journal(store, HELD)) == (case.held, ())
    begun = {line[0] for line in crash_app.ledger_lines() if line[1] == TASK}

    worker = WorkflowWorker(
        store, crash_app.registry(), WorkerId.parse("recovery"), crash_app.LEASE, crash_app.HEARTBEAT
    )
    try:
        for task_id in reversed(tasks):
            crash_app.drive(worker, task_id)
        record = store.get_task(TASK)
        if case.ambiguous is not None:
            assert (record.state, record.outcome, record.ambiguous_effect) == (
                TaskState.TERMINAL,
                TaskOutcome.FAILED,
                CHARGE_KEY,
            ), record.reason
            result = json.dumps({"charge": f"ch-{CHARGE_KEY}"}) if case.ambiguous else None
            store.resolve_effect(
                TASK, CHARGE_KEY, applied=case.ambiguous, result_json=result, actor="ops", reason="checked"
            )
            crash_app.drive(worker, TASK)
            record = store.get_task(TASK)
    finally:
        worker.close()

    lines = crash_app.ledger_lines()
    if case.cancel:
        assert (record.state, record.outcome, lines) == (TaskState.CANCELLED, None, [])
        return
    assert (record.state, record.outcome) == (TaskState.TERMINAL, TaskOutcome.COMPLETED), record.reason
    assert record.result == result_of(TASK, 2 if case.order.startswith(crash_app.RENEW) else 1)
    ran_twice = set(case.ran_twice) | ({"prepare"} & begun if case.racy_first_body else set())
    runs = Counter(line[0] for line in lines if line[1] == TASK)
    more = dict(case.more_runs)
    assert runs == {body: more.get(body, 2 if body in ran_twice else 1) for body in crash_app.BODIES}
    if case.held is not None:  # the held task never started under the dead worker
        assert store.get_task(HELD).result == result_of(HELD)
        assert Counter(line[0] for line in lines if line[1] == HELD) == dict.fromkeys(crash_app.BODIES, 1)
    for body in crash_app.BODIES:  # every run of an effect used the same idempotency key
        assert len({line[3] for line in lines if line[:2] == [body, TASK]}) == 1
    journal = entries(store, TASK)
    ship = next(e for e in journal if e["call_id"] == "ship#1")
    assert ship["evidence"] == (case.evidence or "ran")
    assert store.pending_signals(TASK, "go") == []
    consumed = [e for e in store.history(TASK) if e.kind == "signal_consumed"]
    assert len(consumed) == 1
    # Published once per key whatever crashed where: the signal's payload, as consumed.
    assert [(e.key, e.value) for e in store.published_events(TASK)] == [("approval", {"ok": True})]
    if name == "after_claim":
        assert sum(e.kind == "claimed" for e in store.history(TASK)) >= 2


def test_a_clean_run_of_the_matrix_workflow_runs_every_body_once(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The baseline the cases compare with (no crash point armed)."""
    ledger = tmp_path / "ledger.txt"
    monkeypatch.setenv(crash_app.LEDGER_ENV, str(ledger))
    store = backend.open()
    store.enqueue(WorkflowTask.new("crashy", 1, "order-1", checkpoint_id=TASK))
    store.send_signal(TASK, "go", {"ok": True}, signal_id="s1", sender="test")
    worker = WorkflowWorker(
        store, crash_app.registry(), WorkerId.parse("w"), crash_app.LEASE, crash_app.HEARTBEAT
    )
    try:
        assert crash_app.drive(worker, TASK)[-1] == "completed"
    finally:
        worker.close()
    assert store.get_task(TASK).result == RESULT
    assert Counter(line[0] for line in crash_app.ledger_lines()) == dict.fromkeys(crash_app.BODIES, 1)
