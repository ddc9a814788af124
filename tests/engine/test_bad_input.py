"""Bad input, each refused or contained with an error naming it, nothing else lost or
stuck, on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import (
    Budget,
    LeaseDuration,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.errors import InvalidArgument
from runifold_sync.model.checkpoint import DEFAULT_MAX_ENTRY_BYTES
from runifold_sync.model.codec import MAX_NESTING_DEPTH, from_json
from runifold_sync.outcomes import Completed, Failed, FailureDetail, Idle, RunOutcome
from runifold_sync.store import TaskOutcome, TaskState
from tests.support.backends import contract_backend
from tests.support.clock import Clock
from tests.support.journals import entries

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
SQL_NAME = "x'); DROP TABLE runifold_tasks; --"


def _nested(depth: int) -> Any:
    """Lists nested ``depth`` levels deep (``[]`` is one level)."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _worker(store: WorkflowStore, *workflows: Workflow, **options: Any) -> WorkflowWorker:
    registry = WorkflowRegistry()
    for workflow in workflows:
        registry.register(WorkflowDefinition(workflow))
    return WorkflowWorker(store, registry, WorkerId.parse("w1"), LEASE, timedelta(seconds=5), **options)


def _run_all(worker: WorkflowWorker, cycles: int) -> dict[str, RunOutcome]:
    """Run ``cycles`` cycles, then one more that must find nothing left to claim."""
    try:
        outcomes = {o.task_id: o for o in (worker.run_once() for _ in range(cycles))}
        assert worker.run_once() == Idle()
    finally:
        worker.close()
    return outcomes


def _vandalise(store: WorkflowStore, task_id: str, text: str) -> None:
    """Overwrite the checkpoint of ``task_id`` (next to be claimed) under its own lease,
    as a buggy tool might, and put it back in the queue."""
    (claimed,) = store.claim(WorkerId.parse("vandal"), LEASE)
    assert claimed.lease.task_id == task_id
    store.commit_checkpoint(claimed.lease, claimed.revision, text)
    store.release(claimed.lease, delay=timedelta(0), reason="vandalised")


# A workflow whose first step counts its real runs, so a test can tell that a task it
# failed closed never ran anything.
counted = Workflow("counted", 1)
COUNTED_RUNS: list[str] = []


@counted.step()
def tally(ctx: StepContext, n: int) -> int:
    COUNTED_RUNS.append(ctx.task_id)
    return n + 1


@counted.main
def counted_main(ctx: WorkflowContext, n: int) -> int:
    return tally(ctx, n)


@pytest.fixture(autouse=True)
def _fresh_counts() -> None:
    COUNTED_RUNS.clear()


def test_names_with_sql_metacharacters_are_stored_as_plain_text(store: WorkflowStore) -> None:
    task = WorkflowTask.new(SQL_NAME, 1, {"q": SQL_NAME}, tenant=SQL_NAME, checkpoint_id=SQL_NAME)
    assert store.enqueue(task).created
    record = store.get_task(SQL_NAME)
    assert (record.definition_name, record.tenant, record.input) == (SQL_NAME, SQL_NAME, {"q": SQL_NAME})
    assert [t.task_id for t in store.list_tasks(tenant=SQL_NAME)] == [SQL_NAME]


def _noop(ctx: StepContext) -> None:
    return None


# By case: the field as the error names it, and a call that passes ``bad`` in it, to
# the store (enqueue, signal, operator actions) or to the authoring API a worker's
# registry is built from.
NAMED_FIELDS: dict[str, tuple[str, Callable[[WorkflowStore, str], object]]] = {
    "tenant": ("tenant", lambda store, bad: store.enqueue(WorkflowTask.new("counted", 1, 1, tenant=bad))),
    "checkpoint-id": (
        "checkpoint id",
        lambda store, bad: store.enqueue(WorkflowTask.new("counted", 1, 1, checkpoint_id=bad)),
    ),
    "workflow-name": ("workflow name", lambda store, bad: store.enqueue(WorkflowTask.new(bad, 1, 1))),
    "signal-name": (
        "signal name",
        lambda store, bad: store.send_signal("sibling", bad, 1, signal_id="s1", sender="ops"),
    ),
    "signal-id": (
        "signal id",
        lambda store, bad: store.send_signal("sibling", "go", 1, signal_id=bad, sender="ops"),
    ),
    "sender": (
        "sender",
        lambda store, bad: store.send_signal("sibling", "go", 1, signal_id="s1", sender=bad),
    ),
    "signal-tenant": (
        "tenant",
        lambda store, bad: store.send_signal("sibling", "go", 1, signal_id="s1", sender="ops", tenant=bad),
    ),
    "signal-reason": (
        "reason",
        lambda store, bad: store.send_signal("sibling", "go", 1, signal_id="s1", sender="ops", reason=bad),
    ),
    "cancel-actor": ("actor", lambda store, bad: store.cancel("sibling", bad, "no longer needed")),
    "requeue-reason": ("reason", lambda store, bad: store.requeue("sibling", actor="ops", reason=bad)),
    "declared-signal": ("signal name", lambda store, bad: Workflow("named", 1, signals=[bad])),
    "step-id": ("step id", lambda store, bad: Workflow("named", 1).step(bad)(_noop)),
    "effect-id": ("effect id", lambda store, bad: Workflow("named", 1).effect(bad, idempotent=True)(_noop)),
}


@pytest.mark.parametrize("bad", ["go\nnow", "esc\x1b[31m", "rtl\u202eevil", "del\x7f"])
@pytest.mark.parametrize("case", NAMED_FIELDS)
def test_a_name_with_control_characters_is_refused_naming_its_field_and_a_sibling_still_completes(
    store: WorkflowStore, case: str, bad: str
) -> None:
    store.enqueue(WorkflowTask.new("counted", 1, 1, checkpoint_id="sibling"))
    history = store.history("sibling")
    field, attempt = NAMED_FIELDS[case]
    with pytest.raises(
        InvalidArgument, match=f"^{field} contains control characters: {re.escape(repr(bad))}$"
    ):
        attempt(store, bad)

    assert [t.task_id for t in store.list_tasks()] == ["sibling"]
    assert store.history("sibling") == history  # nothing recorded, not even a refusal
    assert _run_all(_worker(store, counted), 1) == {"sibling": Completed("sibling", 2)}


TOO_DEEP = f"nests deeper than {MAX_NESTING_DEPTH} levels"


# 330 levels encode without hitting the interpreter's recursion limit at enqueue, but
# not from inside a worker's step: the limit must refuse them at the call, not later.
@pytest.mark.parametrize("depth", [MAX_NESTING_DEPTH + 1, 330, 100_000])
def test_deeply_nested_input_is_refused_at_enqueue_naming_the_problem(depth: int) -> None:
    with pytest.raises(InvalidArgument, match=f"^workflow input {TOO_DEEP}$"):
        WorkflowTask.new("deep", 1, _nested(depth))


echo = Workflow("echo", 1, signals=["deep"])


@echo.step()
def build(ctx: StepContext, spec: dict[str, Any]) -> Any:
    return _nested(spec["depth"]) if spec["where"] == "output" else spec


@echo.main
def echo_main(ctx: WorkflowContext, spec: dict[str, Any]) -> Any:
    """Puts a value nested ``depth`` deep where ``where`` says: a step output, the
    result, or a signal payload (returned); an input is echoed by a step and returned."""
    if spec["where"] == "result":
        return _nested(spec["depth"])
    if spec["where"] == "signal":
        return ctx.wait_for_signal("deep")
    output = build(ctx, spec)
    return output if spec["where"] == "input" else "built"


def test_an_input_nested_exactly_at_the_limit_is_echoed_by_a_step_and_returned(store: WorkflowStore) -> None:
    deepest = {"where": "input", "value": _nested(MAX_NESTING_DEPTH - 1)}  # the dict is a level
    store.enqueue(WorkflowTask.new("echo", 1, deepest, checkpoint_id="t"))
    assert _run_all(_worker(store, echo), 1) == {"t": Completed("t", deepest)}
    assert store.get_task("t").result == deepest


@pytest.mark.parametrize(
    ("where", "reason", "error"),
    [
        (
            "output",
            f"output of 'build#1' cannot be stored as JSON: {TOO_DEEP}",
            FailureDetail(
                "OutputNotSerializable",
                f"output of 'build#1' cannot be stored as JSON: {TOO_DEEP}",
                "over",
                "build",
            ),
        ),
        (
            "result",
            f"workflow result cannot be stored as JSON: {TOO_DEEP}",
            FailureDetail(
                "OutputNotSerializable", f"output of 'result' cannot be stored as JSON: {TOO_DEEP}", "over"
            ),
        ),
    ],
)
def test_an_output_or_result_one_level_past_the_limit_fails_its_task_and_one_at_it_completes(
    store: WorkflowStore, where: str, reason: str, error: FailureDetail
) -> None:
    store.enqueue(
        WorkflowTask.new("echo", 1, {"where": where, "depth": MAX_NESTING_DEPTH + 1}, checkpoint_id="over")
    )
    store.enqueue(
        WorkflowTask.new("echo", 1, {"where": where, "depth": MAX_NESTING_DEPTH}, checkpoint_id="at")
    )
    outcomes = _run_all(_worker(store, echo), 2)

    assert outcomes["over"] == Failed(
        "over", reason, recoverable=False, cause="not_serializable", error=error
    )
    over = store.get_task("over")
    assert (over.state, over.outcome, over.reason) == (TaskState.TERMINAL, TaskOutcome.FAILED, reason)
    expected = _nested(MAX_NESTING_DEPTH) if where == "result" else "built"
    assert outcomes["at"] == Completed("at", expected)


def test_a_signal_payload_one_level_past_the_limit_is_refused_and_one_at_it_is_delivered(
    store: WorkflowStore,
) -> None:
    store.enqueue(WorkflowTask.new("echo", 1, {"where": "signal"}, checkpoint_id="t"))
    worker = _worker(store, echo)
    try:
        assert worker.run_once().kind == "suspended"
        with pytest.raises(InvalidArgument, match=f"^payload of signal 'too-deep' {TOO_DEEP}$"):
            store.send_signal("t", "deep", _nested(MAX_NESTING_DEPTH + 1), signal_id="too-deep", sender="s")
        assert store.pending_signals("t", "deep") == []
        deepest = _nested(MAX_NESTING_DEPTH)
        store.send_signal("t", "deep", deepest, signal_id="deepest", sender="s")
        assert worker.run_once() == Completed("t", deepest)
    finally:
        worker.close()


def test_a_step_output_that_cannot_be_stored_fails_only_its_task(store: WorkflowStore) -> None:
    workflow = Workflow("bad-output", 1)

    @workflow.step()
    def produce(ctx: StepContext, kind: str) -> Any:
        unstorable = {
            "deep": _nested(100_000),
            "object": object(),
            "nan": float("nan"),
            # PostgreSQL's JSONB refuses these two; SQLite is held to the same rule.
            "nul": {"note": "a\x00b"},
            "surrogate": ["\ud800"],
        }
        return unstorable.get(kind, kind)

    @workflow.main
    def main(ctx: WorkflowContext, kind: str) -> Any:
        return produce(ctx, kind)

    bad = ("deep", "object", "nan", "nul", "surrogate")
    for kind in (*bad, "fine"):
        store.enqueue(WorkflowTask.new("bad-output", 1, kind, checkpoint_id=kind))
    outcomes = _run_all(_worker(store, workflow), len(bad) + 1)
    for kind in bad:
        outcome = outcomes[kind]
        assert isinstance(outcome, Failed)
        assert "output of 'produce#1' cannot be stored as JSON" in outcome.reason
    assert outcomes["deep"].reason.endswith(f"JSON: {TOO_DEEP}")
    assert "contains U+0000" in outcomes["nul"].reason
    assert "contains a lone surrogate" in outcomes["surrogate"].reason
    assert outcomes["fine"].kind == "completed" and store.get_task("fine").result == "fine"


def test_a_corrupt_checkpoint_fails_its_task_closed_and_others_go_on(store: WorkflowStore) -> None:
    workflow = Workflow("corruptible", 1)

    @workflow.step()
    def one(ctx: StepContext) -> int:
        return 1

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> int:
        one(ctx)
        ctx.sleep(timedelta(seconds=5))
        return one(ctx)

    for task_id in ("corrupt", "healthy"):
        store.enqueue(WorkflowTask.new("corruptible", 1, None, checkpoint_id=task_id))
    # Corrupt one task's checkpoint under its own lease, as a buggy tool might.
    (claimed,) = store.claim(WorkerId.parse("vandal"), LEASE)
    assert claimed.lease.task_id == "corrupt"
    store.commit_checkpoint(
        claimed.lease, claimed.revision, '{"format_version": 2, "definition": "nonsense"}'
    )
    store.release(claimed.lease, delay=timedelta(0), reason="vandalised")
    outcomes = _run_all(_worker(store, workflow), 2)
    corrupt = outcomes["corrupt"]
    assert isinstance(corrupt, Failed) and "checkpoint of task 'corrupt' is corrupt" in corrupt.reason
    assert outcomes["healthy"].kind == "suspended"
    assert store.get_task("corrupt").state is TaskState.TERMINAL


def _assert_failed_closed(
    store: WorkflowStore, outcome: RunOutcome, task_id: str, reason: str, error_class: str | None
) -> None:
    error = FailureDetail(error_class, reason, task_id)
    assert outcome == Failed(task_id, reason, recoverable=False, cause="checkpoint", error=error)
    record = store.get_task(task_id)
    assert (record.state, record.outcome, record.reason) == (TaskState.TERMINAL, TaskOutcome.FAILED, reason)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            '{"format_version": 3}',
            "checkpoint of task 'bad' has format version 3; this runifold_sync reads version 2",
        ),
        ('["not", "a", "checkpoint"]', "checkpoint of task 'bad' is corrupt: an array, not an object"),
        ('"a checkpoint"', "checkpoint of task 'bad' is corrupt: a string, not an object"),
    ],
    ids=["other-format-version", "array", "string"],
)
def test_a_checkpoint_of_another_format_version_or_shape_fails_only_its_task_closed(
    store: WorkflowStore, text: str, reason: str
) -> None:
    for task_id in ("bad", "sibling"):
        store.enqueue(WorkflowTask.new("counted", 1, 1, checkpoint_id=task_id))
    _vandalise(store, "bad", text)
    outcomes = _run_all(_worker(store, counted), 2)

    _assert_failed_closed(store, outcomes["bad"], "bad", reason, "CheckpointError")
    # Kept as found, for whoever investigates; nothing ran on it.
    assert from_json(store.get_task("bad").checkpoint_json or "") == from_json(text)
    assert outcomes["sibling"] == Completed("sibling", 2)
    assert COUNTED_RUNS == ["sibling"]


def test_a_checkpoint_row_that_is_not_json_fails_only_its_task_closed(sqlite_store: WorkflowStore) -> None:
    """SQLite stores checkpoints as text, so a torn or hand-edited row can hold anything;
    PostgreSQL's JSONB column cannot hold text that is not JSON at all, so its nearest
    corruptions are the other shapes above."""
    store = sqlite_store
    for task_id in ("bad", "sibling"):
        store.enqueue(WorkflowTask.new("counted", 1, 1, checkpoint_id=task_id))
    torn = '{"format_version": 2, "usage": ['
    _vandalise(store, "bad", torn)
    outcomes = _run_all(_worker(store, counted), 2)

    reason = "checkpoint of task 'bad' is corrupt: Expecting value: line 1 column 33 (char 32)"
    _assert_failed_closed(store, outcomes["bad"], "bad", reason, "CheckpointError")
    assert store.get_task("bad").checkpoint_json == torn
    assert outcomes["sibling"] == Completed("sibling", 2)
    assert COUNTED_RUNS == ["sibling"]


def test_an_unregistered_definition_version_is_left_unclaimed_and_others_run(
    store: WorkflowStore, clock: Clock
) -> None:
    store.enqueue(WorkflowTask.new("counted", 2, 1, checkpoint_id="v2"))
    store.enqueue(WorkflowTask.new("counted", 1, 1, checkpoint_id="v1"))

    lacking = _worker(store, counted)  # has version 1 only
    try:
        assert lacking.run_once() == Completed("v1", 2)  # the registered version runs
        for _ in range(2):
            assert lacking.run_once() == Idle()  # version 2 is never claimed by it
            clock.advance(timedelta(seconds=6))
        record = store.get_task("v2")
        assert (record.state, record.claims_since_progress, record.fencing_token) == (TaskState.QUEUED, 0, 0)
        assert record.status_note == "no live worker serves 'counted' version 2 in queue 'default'"
    finally:
        lacking.close()
    assert COUNTED_RUNS == ["v1"]

    counted_v2 = Workflow("counted", 2)

    @counted_v2.step()
    def tally(ctx: StepContext, n: int) -> int:
        COUNTED_RUNS.append(ctx.task_id)
        return n + 2

    @counted_v2.main
    def main(ctx: WorkflowContext, n: int) -> int:
        return tally(ctx, n)

    # Nothing used up its budget of one attempt.
    clock.advance(timedelta(seconds=6))
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(counted_v2, Budget(max_attempts=1)))
    capable = WorkflowWorker(store, registry, WorkerId.parse("capable"), LEASE, timedelta(seconds=5))
    try:
        assert capable.run_once() == Completed("v2", 3)
    finally:
        capable.close()
    assert COUNTED_RUNS == ["v1", "v2"]


# --- size limits ------------------------------------------------------------------------

SMALL_LIMIT = 4096


def test_a_step_output_over_max_entry_bytes_fails_only_its_task_naming_the_sizes(
    store: WorkflowStore,
) -> None:
    workflow = Workflow("big-output", 1)

    @workflow.step()
    def produce(ctx: StepContext, size: int) -> str:
        return "x" * size

    @workflow.main
    def main(ctx: WorkflowContext, size: int) -> int:
        return len(produce(ctx, size))

    store.enqueue(WorkflowTask.new("big-output", 1, SMALL_LIMIT, checkpoint_id="big"))
    store.enqueue(WorkflowTask.new("big-output", 1, 10, checkpoint_id="small"))
    outcomes = _run_all(_worker(store, workflow, max_entry_bytes=SMALL_LIMIT), 2)

    big = outcomes["big"]
    assert isinstance(big, Failed) and big.cause == "checkpoint"
    size = re.fullmatch(
        r"journal entry 'produce#1' of task 'big' is (\d+) bytes, over the limit of 4096 bytes "
        r"\(max_entry_bytes\); keep large artifacts outside and store their ids",
        big.reason,
    )
    assert size is not None and int(size[1]) > SMALL_LIMIT
    _assert_failed_closed(store, big, "big", big.reason, "CheckpointTooLarge")
    assert store.get_task("big").checkpoint_json is None  # the output was never stored
    assert entries(store, "big") == []
    assert outcomes["small"] == Completed("small", 10)


@pytest.mark.parametrize("value", [1023, 0, -1, True, 4096.0, "4096"])
def test_max_entry_bytes_below_the_minimum_or_not_an_integer_is_refused_naming_it(
    sqlite_store: WorkflowStore, value: Any
) -> None:
    with pytest.raises(InvalidArgument) as info:
        WorkflowWorker(
            sqlite_store,
            WorkflowRegistry(),
            WorkerId.parse("w1"),
            LEASE,
            timedelta(seconds=5),
            max_entry_bytes=value,
        )
    assert str(info.value) == f"max_entry_bytes must be an integer >= 1024, got {value!r}"


def test_a_workflow_result_over_max_entry_bytes_fails_only_its_task_naming_the_sizes(
    store: WorkflowStore,
) -> None:
    workflow = Workflow("big-result", 1)

    @workflow.step()
    def measure(ctx: StepContext, size: int) -> int:
        return size

    @workflow.main
    def main(ctx: WorkflowContext, size: int) -> str:
        return "x" * measure(ctx, size)  # built in main: the checkpoint stays small

    store.enqueue(WorkflowTask.new("big-result", 1, 3 * 1024 * 1024, checkpoint_id="big"))
    store.enqueue(WorkflowTask.new("big-result", 1, 10, checkpoint_id="small"))
    outcomes = _run_all(_worker(store, workflow), 2)  # the default limit, 1 MiB

    reason = (
        f"workflow result of task 'big' is {3 * 1024 * 1024 + 2} bytes, over the limit of "
        f"{DEFAULT_MAX_ENTRY_BYTES} bytes (max_entry_bytes); keep large artifacts "
        "outside and return their ids"
    )
    _assert_failed_closed(store, outcomes["big"], "big", reason, None)  # nothing raised: a limit
    record = store.get_task("big")
    assert record.result is None
    journal = entries(store, "big")
    assert [(e["call_id"], e["status"], e["output"]) for e in journal] == [
        ("measure#1", "done", 3 * 1024 * 1024)
    ]
    assert outcomes["small"] == Completed("small", "x" * 10)
