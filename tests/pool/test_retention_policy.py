"""The retention of a running pool (``run --retention``): its policy's checks and
defaults, the pacing loop on a real store, and how the CLI writes a duration back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from runifold_sync import (
    CancellationToken,
    LeaseDuration,
    RetentionPolicy,
    WorkerId,
    WorkflowTask,
    keep_pruning,
)
from runifold_sync.cli.common import duration_text
from runifold_sync.errors import InvalidArgument
from runifold_sync.pool.retention import paced
from runifold_sync.sqlite import SqliteWorkflowStore


@pytest.mark.parametrize(
    ("retention", "every"),
    [
        (timedelta(days=30), timedelta(minutes=1)),
        (timedelta(minutes=5), timedelta(seconds=30)),
        (timedelta(seconds=3), timedelta(seconds=1)),
        (timedelta(0), timedelta(seconds=1)),
    ],
)
def test_a_pool_looks_again_every_tenth_of_its_retention_from_a_second_to_a_minute(
    retention: timedelta, every: timedelta
) -> None:
    assert RetentionPolicy(retention).every == every


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"older_than": timedelta(seconds=-1)}, "retention must be non-negative, got"),
        ({"older_than": "30d"}, "retention must be a datetime.timedelta, got '30d'"),
        (
            {"older_than": timedelta(days=1), "batch": 0},
            "retention batch must be an integer in 1..10000, got 0",
        ),
        ({"older_than": timedelta(days=1), "share": 0}, "retention share must be a number in (0, 1], got 0"),
        (
            {"older_than": timedelta(days=1), "share": 1.5},
            "retention share must be a number in (0, 1], got 1.5",
        ),
        ({"older_than": timedelta(days=1), "every": timedelta(0)}, "retention interval must be positive"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_value(arguments: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        RetentionPolicy(**arguments)  # type: ignore[arg-type]
    assert message in str(refused.value)


def test_keep_pruning_deletes_in_batches_until_stopped(sqlite_store: SqliteWorkflowStore) -> None:
    for n in range(5):
        sqlite_store.enqueue(WorkflowTask.new("orders", 1, n, checkpoint_id=f"t{n}"))
        [claimed] = sqlite_store.claim(WorkerId.parse("w1"), LeaseDuration(timedelta(seconds=30)))
        sqlite_store.complete(claimed.lease, claimed.revision, "{}", "null")
    token = CancellationToken()
    batches: list[int] = []

    def heard(deleted: int) -> None:
        batches.append(deleted)
        if sum(batches) == 5:
            token.cancel()

    policy = RetentionPolicy(timedelta(0), batch=2, share=0.5)
    pruner = threading.Thread(
        target=lambda: batches.append(-keep_pruning(sqlite_store, policy, token, on_batch=heard))
    )
    pruner.start()
    pruner.join(timeout=30)

    assert not pruner.is_alive()
    assert batches == [2, 2, 1, -5]  # its batches, then what it returned (negated)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(days=30), "30d"),
        (timedelta(hours=12), "12h"),
        (timedelta(minutes=90), "1h30m"),
        (timedelta(seconds=45), "45s"),
        (timedelta(seconds=1.5), "1.5s"),
        (timedelta(0), "0s"),
    ],
)
def test_a_duration_is_written_the_way_the_options_take_it(value: timedelta, text: str) -> None:
    assert duration_text(value) == text


def _slow_batches(count: int, busy_s: float) -> Iterator[int]:
    for _ in range(count):
        time.sleep(busy_s)
        yield 1


def test_paced_batches_rest_so_they_take_at_most_their_share_of_the_time() -> None:
    started = time.monotonic()
    assert sum(paced(_slow_batches(4, 0.05), 0.25, CancellationToken())) == 4
    elapsed = time.monotonic() - started
    assert elapsed >= 4 * 0.05 / 0.25 * 0.9  # busy 0.2 s, resting three times as long


def test_a_cancelled_token_ends_the_walk_after_the_batch_in_hand() -> None:
    token = CancellationToken()
    token.cancel()
    assert list(paced(_slow_batches(4, 0.01), 0.5, token)) == [1]
    with pytest.raises(InvalidArgument, match=r"retention share must be a number in \(0, 1\], got 0"):
        list(paced(_slow_batches(1, 0), 0, token))
