"""``OutageLog``: the first failure of an outage is one warning naming the store and why,
the rest are debug lines, the first answer after it is one warning saying how long it
lasted; passwords never reach the log, and only outages lose their traceback."""

from __future__ import annotations

import logging

import pytest

from runifold_sync.errors import StoreClosed, StoreNotWritable, StoreUnavailable
from runifold_sync.store.outage import OutageLog, is_outage

WHERE = "PostgreSQL database app at db:5432"


def _said(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and r.name == "runifold_sync.store"]


def test_an_outage_is_one_warning_then_debug_lines_and_one_warning_when_it_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="runifold_sync")
    outage = OutageLog(WHERE)
    outage.answered()  # answering while up says nothing
    for n in range(3):
        outage.failed(StoreUnavailable(f"{WHERE}: OperationalError: refused {n}"), "a cycle")
    assert outage.down
    outage.answered()
    outage.answered()
    assert not outage.down
    assert _said(caplog, logging.WARNING)[0] == (
        f"{WHERE} is unavailable, retrying until it answers (a cycle: OperationalError: refused 0)"
    )
    assert _said(caplog, logging.DEBUG) == [
        f"{WHERE} still unavailable (a cycle: OperationalError: refused {n})" for n in (1, 2)
    ]
    back = _said(caplog, logging.WARNING)[1:]
    assert len(back) == 1 and back[0].startswith(f"{WHERE} is available again after ")
    assert back[0].endswith(" s (3 failed operations meanwhile)")


def test_the_next_outage_is_said_again(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="runifold_sync")
    outage = OutageLog(WHERE)
    for _ in range(2):
        outage.failed(StoreUnavailable("refused"), "connecting")
        outage.answered()
    kinds = ["back" if "available again" in line else "down" for line in _said(caplog, logging.WARNING)]
    assert kinds == ["down", "back", "down", "back"]


def test_a_multi_line_driver_error_is_one_line_with_its_passwords_masked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="runifold_sync")
    outage = OutageLog(WHERE, "postgresql://app:hunter2@db:5432/app")
    error = StoreUnavailable(
        'connection to server at "db" failed: password hunter2 refused\n\tIs the server running?'
    )
    outage.failed(error, "connecting")
    (line,) = _said(caplog, logging.WARNING)
    assert "hunter2" not in line and "\n" not in line
    assert line.endswith(
        '(connecting: connection to server at "db" failed: password *** refused Is the server running?)'
    )


def test_report_keeps_tracebacks_for_bugs_and_gives_refused_writes_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="runifold_sync")
    outage = OutageLog(WHERE)
    logger = logging.getLogger("runifold_sync.worker.worker")
    outage.report(logger, "cycle failed", StoreNotWritable("read-only server"), {"worker_id": "w1"})
    outage.report(logger, "cycle failed", StoreClosed("closed"), {"worker_id": "w1"})
    try:
        raise KeyError("a bug")
    except KeyError as exc:
        outage.report(logger, "cycle failed", exc, {"worker_id": "w1"})
    outage.report(logger, "cycle failed", StoreUnavailable("refused"), {"worker_id": "w1"})
    worker = [r for r in caplog.records if r.name == "runifold_sync.worker.worker"]
    assert [(r.levelno, r.getMessage(), r.exc_info is not None) for r in worker] == [
        (logging.WARNING, "cycle failed: read-only server", False),
        (logging.WARNING, "cycle failed: closed", False),
        (logging.ERROR, "cycle failed", True),
    ]
    assert all(r.worker_id == "w1" for r in worker)  # type: ignore[attr-defined]
    assert outage.down and _said(caplog, logging.WARNING) == [
        f"{WHERE} is unavailable, retrying until it answers (cycle failed: refused)"
    ]


def test_only_an_unavailable_store_is_an_outage() -> None:
    assert is_outage(StoreUnavailable("refused"))
    assert not is_outage(StoreNotWritable("read-only"))
    assert not is_outage(StoreClosed("closed"))
    assert not is_outage(RuntimeError("bug"))
