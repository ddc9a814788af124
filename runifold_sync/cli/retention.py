"""``prune``: delete finished tasks older than a cutoff, with their history, journal,
signals and events (``store.prune``), saying on stderr how far a long run has got."""

from __future__ import annotations

import time
from datetime import timedelta

import click

from ..model.cancellation import CancellationToken
from ..pool.retention import paced
from ..store.checks import MAX_PRUNE_BATCH
from .common import database_option, duration, duration_text, echo_json, json_option, opened_store

_PROGRESS_EVERY_S = 2.0


@click.command()
@click.option(
    "--older-than",
    required=True,
    metavar="DURATION",
    callback=duration,
    help="Prune tasks finished and last changed longer ago than this (store time): 30d, 12h, 90m, 45s.",
)
@click.option("--dry-run", is_flag=True, help="Count what would be pruned; delete nothing.")
@click.option(
    "--include-ambiguous",
    is_flag=True,
    help="Also prune tasks failed on an ambiguous effect nobody resolved (kept by default: "
    "they wait for an operator's decision).",
)
@click.option(
    "--share",
    type=click.FloatRange(0, 1, min_open=True),
    default=0.25,
    show_default=True,
    help="Most of the time spent deleting: after each batch the prune rests so that batches "
    "take at most this share of it, leaving the database to running workers (1: no rest).",
)
@click.option(
    "--batch",
    type=click.IntRange(1, MAX_PRUNE_BATCH),
    default=1000,
    show_default=True,
    help="Tasks deleted per transaction.",
)
@database_option
@json_option
def prune(
    older_than: timedelta,
    dry_run: bool,
    include_ambiguous: bool,
    share: float,
    batch: int,
    database: str | None,
    as_json: bool,
) -> None:
    """Delete finished tasks (completed, failed or cancelled) last changed more than
    --older-than ago, with all their rows, in short transactions that running workers
    do not wait for, resting between them (--share). Kept: unfinished tasks, tasks
    failed on an unresolved ambiguous effect (unless --include-ambiguous), a parent
    until its children have finished, a child while its parent is kept. A pruned task
    id can be enqueued again as a new task. A dry run reads without resting."""
    pruned = batches = 0
    started = said = time.monotonic()
    with opened_store(database) as store:
        walk = store.prune_batches(
            older_than, batch=batch, include_ambiguous=include_ambiguous, dry_run=dry_run
        )
        for deleted in paced(walk, 1.0 if dry_run else share, CancellationToken()):
            pruned += deleted
            batches += 1
            if time.monotonic() - said >= _PROGRESS_EVERY_S:
                said = time.monotonic()
                doing = "counted" if dry_run else "pruned"
                click.echo(
                    f"{doing} {pruned} tasks so far ({batches} batches, {said - started:.0f} s)", err=True
                )
    if as_json:
        echo_json(
            {
                "pruned": pruned,
                "dry_run": dry_run,
                "older_than_s": older_than.total_seconds(),
                "include_ambiguous": include_ambiguous,
                "batches": batches,
            }
        )
    else:
        doing = "would prune" if dry_run else "pruned"
        click.echo(f"{doing} {pruned} finished tasks last changed more than {duration_text(older_than)} ago")
