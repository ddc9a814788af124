"""The chaos tool's scenario figures, computed from histories built by hand: tasks
arrive at 10 a second and finish in 0.1 s, a fault stalls the pool for two seconds and
holds one task past its lease; each figure must say so, and a task that never finished
or finished twice must be counted."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from runifold_sync.store import TaskEvent

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

from chaos_scenarios import TaskTimes, Window, figures, task_times  # noqa: E402

T0 = 1_700_000_000.0
FAULT = Window("terminate-backends", T0 + 5.0, T0 + 7.0, {"backends terminated": 8})


def _event(task_id: str, at_s: float, kind: str) -> TaskEvent:
    return TaskEvent(0, task_id, datetime.fromtimestamp(T0 + at_s, UTC), kind, "w", 1, {})


def _task(enqueued_s: float, claimed_s: float | None, completed_s: list[float]) -> TaskTimes:
    return TaskTimes(
        T0 + enqueued_s,
        None if claimed_s is None else T0 + claimed_s,
        min((T0 + c for c in completed_s), default=None),
        len(completed_s),
    )


def _run() -> dict[str, TaskTimes]:
    """200 tasks over 20 s. The fault (5-7 s) stalls every claim until 7.5 s, and the
    task claimed at 4.95 s is held until 9 s (its lease) though the fault ended at 7 s."""
    times = {}
    for n in range(200):
        at = n / 10
        if at == 4.9:
            times[f"t{n}"] = _task(at, 4.95, [9.0])
        elif 5.0 <= at < 7.5:
            times[f"t{n}"] = _task(at, 7.5, [7.6])
        else:
            times[f"t{n}"] = _task(at, at + 0.01, [at + 0.1])
    return times


def test_the_history_gives_each_tasks_enqueue_first_claim_and_completions() -> None:
    events = [
        _event("a", 0.0, "enqueued"),
        _event("a", 0.5, "claimed"),
        _event("a", 1.0, "released"),
        _event("a", 2.0, "claimed"),
        _event("a", 3.0, "completed"),
        _event("b", 1.0, "enqueued"),
    ]
    times = task_times({"a": events[:5], "b": events[5:], "c": []})
    assert times == {"a": _task(0.0, 0.5, [3.0]), "b": _task(1.0, None, [])}


def test_a_stall_and_a_task_held_past_the_fault_give_the_time_to_recover() -> None:
    result = figures(_run(), [f"t{n}" for n in range(200)], [FAULT], set())
    base = result["baseline"]
    assert base["throughput_per_s"] == pytest.approx(10.0, abs=0.3)
    assert (base["pickup_p50_s"], base["pickup_p99_s"]) == (0.01, 0.05)  # p99: the held task's claim
    fault = result["terminate-backends"]
    assert (fault["lost"], fault["completed_twice"], fault["fault_s"]) == (0, 0, 2.0)
    assert fault["throughput_during_fault"] == 0.0  # nothing finished from 5 s to 7 s
    # Claims resumed at 7.5 s, but the held task finished only at 9 s: recovered then.
    assert fault["time_to_recover_s"] == pytest.approx(2.0)
    assert fault["throughput_after_recovery"] == pytest.approx(1.0, abs=0.05)
    assert fault["pickup_p99_s_during"] == pytest.approx(2.5)
    assert fault["did"] == {"backends terminated": 8}


def test_a_task_that_never_finished_is_lost_and_the_pool_never_recovered() -> None:
    times = _run()
    times["t49"] = _task(4.9, 4.95, [])  # held by the fault, never finished
    result = figures(times, [*times, "never-enqueued"], [FAULT], set())
    fault = result["terminate-backends"]
    assert fault["lost"] == 2
    assert fault["lost_tasks"] == ["never-enqueued", "t49"]
    assert fault["time_to_recover_s"] is None and fault["throughput_after_recovery"] is None


def test_a_task_completed_twice_or_charged_twice_is_counted_once() -> None:
    times = _run()
    times["t100"] = _task(10.0, 10.01, [10.1, 10.3])
    result = figures(times, list(times), [FAULT], {"t100", "t120"})
    assert result["terminate-backends"]["completed_twice"] == 2


def test_throughput_that_stays_low_after_the_fault_is_no_recovery() -> None:
    """Half the tasks after the fault wait for a lease each: throughput at half the
    baseline's is not back."""
    times = {}
    for n in range(200):
        at = n / 10
        slow = at >= 7.0 and n % 2 == 1
        times[f"t{n}"] = _task(at, at + 0.01, [30.0 if slow else at + 0.1])
    result = figures(times, list(times), [Window("pg-restart", T0 + 5.0, T0 + 7.0, {})], set())
    fault = result["pg-restart"]
    assert fault["lost"] == 0
    assert fault["time_to_recover_s"] is None


def _takeover(task_id: str, at_s: float) -> TaskEvent:
    at = datetime.fromtimestamp(T0 + at_s, UTC)
    return TaskEvent(0, task_id, at, "claimed", "w2", 2, {"from_state": "leased"})


def test_a_takeover_from_an_expired_lease_counts_as_a_lease_lost_to_the_fault_it_followed() -> None:
    """The task claimed at 4.95 s is taken over at 9 s (after its lease expired), and its
    first worker reports the loss at 9.5 s; a takeover before the fault is not its."""
    held = [
        _event("t49", 4.9, "enqueued"),
        _event("t49", 4.95, "claimed"),
        _takeover("t49", 9.0),
        _event("t49", 9.2, "completed"),
        _event("t49", 9.5, "lease_lost"),
    ]
    early = [
        _event("t1", 0.1, "enqueued"),
        _event("t1", 0.2, "claimed"),
        _takeover("t1", 3.0),
        _event("t1", 3.1, "completed"),
    ]
    times = task_times({"t49": held, "t1": early})
    assert times["t49"].takeovers == (T0 + 9.0,) and times["t49"].lost_lease_reports == (T0 + 9.5,)
    fault = figures(times, ["t49", "t1"], [FAULT], set())["terminate-backends"]
    assert (fault["leases_lost"], fault["lost_lease_reports"]) == (1, 1)
