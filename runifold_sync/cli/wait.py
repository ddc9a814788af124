"""``wait``: block until one task has finished and say how it ended, for scripts and CI
jobs that enqueue work and need its answer (``store.wait_for_task``). The exit code is
the answer: 0 completed, 1 failed or cancelled, 2 still unfinished at the timeout."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Any

import click

from ..errors import WaitTimedOut
from ..model.values import TaskOutcome
from .common import database_option, duration, json_option, opened_store
from .show import record_json

COMPLETED, ENDED_OTHERWISE, TIMED_OUT = 0, 1, 2


@click.command()
@click.argument("task_id")
@click.option(
    "--timeout",
    default="30s",
    show_default=True,
    metavar="DURATION",
    callback=duration,
    help="How long to wait: 30s, 5m, 1h30m, 2d.",
)
@database_option
@json_option
def wait(task_id: str, timeout: timedelta, database: str | None, as_json: bool) -> None:
    """Wait until TASK_ID has finished and print its result, or what it failed or was
    cancelled with. Exits 0 when it completed, 1 when it failed or was cancelled (and on
    an error, such as an unknown task), 2 when it had not finished within --timeout."""
    timed_out = False
    with opened_store(database, reads_only=True) as store:
        try:
            record = store.wait_for_task(task_id, timeout)
        except WaitTimedOut:
            timed_out = True
            record = store.get_task(task_id)  # where it stands now, for the message
    if as_json:
        shown: dict[str, Any] = record_json(record) | {
            "result": record.result,
            "timed_out": timed_out,
            "timeout_s": timeout.total_seconds(),
        }
        click.echo(json.dumps(shown, indent=2))
    elif timed_out:
        why = record.status_note or record.reason
        click.echo(
            f"{task_id}: still {record.state.value} after {timeout.total_seconds():g} s"
            + (f" ({why})" if why else "")
        )
    elif record.outcome is TaskOutcome.COMPLETED:
        click.echo(f"{task_id}: completed")
        click.echo(f"result: {record.result_json}")
    else:
        ended = "failed" if record.outcome is TaskOutcome.FAILED else "cancelled"
        click.echo(f"{task_id}: {ended}: {record.reason}")
    if timed_out:
        sys.exit(TIMED_OUT)
    if record.outcome is not TaskOutcome.COMPLETED:
        sys.exit(ENDED_OTHERWISE)
