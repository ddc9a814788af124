"""The runs in flight of a definition version, read for a deploy: which patches each has
recorded, and whether new code can continue each (a dry replay, ``engine/dry_replay.py``).

A run in flight is a task that is queued, leased or waiting, or recoverable (failed on an
ambiguous effect, so ``resolve_effect`` may set it going again). They are walked a page at
a time (``list_tasks_page``), so a store of millions of tasks is read in bounded pieces;
finished tasks are looked through only when the version has recoverable ones.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs

from ..engine.dry_replay import Divergence, dry_replay
from ..engine.replay import patch_call_id
from ..errors import CheckpointError, InvalidArgument
from ..model.checkpoint import Checkpoint, EntryKind
from ..model.values import TaskState as _State
from ..store.base import WorkflowStore
from ..store.records import TaskRecord, VersionReference
from ..workflow.registry import WorkflowDefinition, WorkflowRegistry

_PAGE = 500
_PATCH_PREFIX = patch_call_id("")


def in_flight(
    store: WorkflowStore, name: str, version: int, *, recoverable: bool = True
) -> Iterator[TaskRecord]:
    """The unfinished tasks of ``name`` at ``version`` (and its recoverable ones when
    ``recoverable``), oldest first within each state."""
    states = [_State.QUEUED, _State.LEASED, _State.WAITING] + ([_State.TERMINAL] if recoverable else [])
    for state in states:
        after: str | None = None
        while True:
            page = store.list_tasks_page(after=after, limit=_PAGE, state=state, definition=name)
            for record in page.tasks:
                if record.definition_version != version:
                    continue
                if state is _State.TERMINAL and record.ambiguous_effect is None:
                    continue
                yield record
            after = page.next_after
            if after is None:
                break


def checkpoint_of(store: WorkflowStore, record: TaskRecord) -> Checkpoint | None:
    """The task's checkpoint with its journals, None before its first claim."""
    if record.checkpoint_json is None:
        return None
    return Checkpoint.decode(record.task_id, record.checkpoint_json, store.read_journal(record.task_id))


def recorded_patches(checkpoint: Checkpoint | None) -> list[str]:
    """The change ids whose markers the run recorded, in journal order (any journal)."""
    if checkpoint is None:
        return []
    found: list[str] = []
    for journal in [checkpoint.journal, *checkpoint.branch_journals.values()]:
        for entry in journal:
            if entry.kind == EntryKind.PATCH:
                change_id = entry.call_id.rpartition("/")[2].removeprefix(_PATCH_PREFIX)
                if change_id not in found:
                    found.append(change_id)
    return found


def _recorded(store: WorkflowStore, record: TaskRecord) -> list[str]:
    try:
        return recorded_patches(checkpoint_of(store, record))
    except CheckpointError:  # unreadable: the claim fails it; a listing goes on
        return []


@attrs.frozen
class TaskPatches:
    """One run in flight and the patches it has (``recorded``) and has not (``missing``)
    recorded, out of those known for its version."""

    task_id: str
    state: str
    recorded: tuple[str, ...]
    missing: tuple[str, ...]


@attrs.frozen
class VersionPatches:
    name: str
    version: int
    known: tuple[str, ...]  # declared by the app's steps (patch=), or recorded by a run
    tasks: tuple[TaskPatches, ...]


def patches_in_flight(
    store: WorkflowStore, references: list[VersionReference], registry: WorkflowRegistry | None
) -> list[VersionPatches]:
    """For each referenced version that has patches (recorded by a run, or declared by
    the registry's steps), every run in flight and the patches it has and has not
    recorded: when none lacks a patch, ``ctx.patched`` can become ``deprecate_patch``;
    when none has it, the call can go."""
    listed = []
    for reference in references:
        definition = None if registry is None else registry.get(reference.name, reference.version)
        declared = set() if definition is None else set(definition.workflow.patches)
        runs = [
            (record, _recorded(store, record))
            for record in in_flight(
                store, reference.name, reference.version, recoverable=bool(reference.recoverable)
            )
        ]
        known = sorted(declared.union(*(set(found) for _record, found in runs)))
        if not known:
            continue
        tasks = tuple(
            TaskPatches(
                record.task_id,
                record.state.value,
                tuple(found),
                tuple(change_id for change_id in known if change_id not in found),
            )
            for record, found in runs
        )
        listed.append(VersionPatches(reference.name, reference.version, tuple(known), tasks))
    return listed


@attrs.frozen
class ReplayFinding:
    """A run in flight that the new code would not continue as recorded."""

    task_id: str
    name: str
    version: int
    divergence: Divergence


@attrs.frozen
class ReplayCheck:
    checked: int  # runs replayed
    diverged: tuple[ReplayFinding, ...]
    unregistered: tuple[tuple[str, int], ...]  # referenced versions the new code lacks


def replay_check(
    store: WorkflowStore, references: list[VersionReference], registry: WorkflowRegistry
) -> ReplayCheck:
    """Replay every run in flight of each referenced version against ``registry``'s
    definition of it, running nothing (``dry_replay``), and list those that diverge."""
    checked, diverged, unregistered = 0, [], []
    for reference in references:
        definition = registry.get(reference.name, reference.version)
        if definition is None:
            unregistered.append((reference.name, reference.version))
            continue
        for record in in_flight(
            store, reference.name, reference.version, recoverable=bool(reference.recoverable)
        ):
            divergence = replay_task(store, definition, record)
            checked += 1
            if divergence is not None:
                diverged.append(ReplayFinding(record.task_id, reference.name, reference.version, divergence))
    return ReplayCheck(checked, tuple(diverged), tuple(unregistered))


def replay_task(
    store: WorkflowStore, definition: WorkflowDefinition, record: TaskRecord
) -> Divergence | None:
    """The dry replay of one stored task against ``definition``."""
    try:
        checkpoint = checkpoint_of(store, record)
    except CheckpointError as exc:
        return Divergence(0, "an unreadable checkpoint", "-", str(exc))
    if checkpoint is None:
        return None  # not started: any code starts it
    return dry_replay(definition, record.task_id, record.input_json, checkpoint)


@attrs.frozen
class UpgradeReport:
    """What ``upgrade`` did: the runs moved to the new version, and those left on the old
    one with why (they diverge from the new code, or were running or changed meanwhile)."""

    moved: tuple[str, ...]
    kept: tuple[tuple[str, str], ...]


def upgrade(
    store: WorkflowStore,
    registry: WorkflowRegistry,
    name: str,
    from_version: int,
    to_version: int,
    *,
    actor: str,
    reason: str,
    dry_run: bool = False,
) -> UpgradeReport:
    """Move each unfinished task of ``name`` at ``from_version`` whose journal replays
    cleanly against ``to_version`` (``dry_replay``) onto it, one task per transaction,
    only if it did not change since it was replayed; leave and list the others. Both
    versions must be registered in ``registry``."""
    target = registry.get(name, to_version)
    if registry.get(name, from_version) is None or target is None:
        missing = from_version if target is not None else to_version
        registry.task(name, missing, None)  # raises UnknownDefinition naming what is registered
        raise AssertionError("unreachable")
    if to_version <= from_version:
        raise InvalidArgument(f"upgrade --to {to_version} must be newer than --from {from_version}")
    moved: list[str] = []
    kept: list[tuple[str, str]] = []
    for record in list(in_flight(store, name, from_version, recoverable=False)):
        if record.state is _State.LEASED:
            kept.append((record.task_id, "running now: upgrade again once it waits or is queued"))
            continue
        divergence = replay_task(store, target, record)
        if divergence is not None:
            kept.append((record.task_id, f"diverges at call {divergence.position}: {divergence.reason}"))
            continue
        if dry_run:
            moved.append(record.task_id)
            continue
        if store.upgrade_task(
            record.task_id, target.identity, revision=record.revision, actor=actor, reason=reason
        ):
            moved.append(record.task_id)
        else:
            kept.append((record.task_id, "changed while it was being checked: upgrade again"))
    return UpgradeReport(tuple(moved), tuple(kept))
