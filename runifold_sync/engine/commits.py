"""Checkpoint commits: the one write path of a claim's progress.

Each commit encodes what changed in the checkpoint (the head, and the journal entries
new or moved on since the last commit, each refused over its size limit), and writes it
through the store fenced by the lease and checked against the revision it extends. A refused
write means the lease is gone; the write also answers whether a cancel is pending, so a
task stops at its next step boundary without waiting for a heartbeat.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ..errors import CheckpointError, LeaseLostError, StoreUnavailable
from ..model import crashpoints
from ..model.attributes import Attribute
from ..model.checkpoint import Checkpoint, CheckpointWrite
from ..store import checks
from ..store.base import WorkflowStore
from ..store.records import Committed, Signal, StreamWrite
from .claim import Claim
from .interrupts import FailRequested, Unwind


@attrs.define
class Progress:
    """The checkpoint and its revision, shared by the main function and its parallel
    branches; the lock serializes their commits into one revision sequence."""

    checkpoint: Checkpoint  # never replaced: Commits keeps it too
    revision: int
    lock: threading.RLock = attrs.Factory(threading.RLock)
    # A step whose result is in the checkpoint but not yet committed: it is committed
    # before the next body runs, or with the cycle's transition (complete, suspend...),
    # which saves the last step of a run its own round trip.
    unsaved: str | None = None
    # Run time (Budget.max_duration) is wall time while claimed: each tick adds the time
    # since the previous one (or since the claim) to the checkpoint's usage.
    ticked_at: float = attrs.Factory(time.monotonic)

    def tick(self, *, steps: int = 0, cost: float = 0.0) -> None:
        """Add the wall time since the last tick, and ``steps`` and ``cost`` if given,
        to usage in one update (caller holds the lock)."""
        now = time.monotonic()
        self.checkpoint.usage = self.checkpoint.usage.spent(steps, cost, now - self.ticked_at)
        self.ticked_at = now


class Commits:
    """The fenced writes of one claim's checkpoint, shared by its main function and its
    parallel branches: their commits form one revision sequence under ``lock``."""

    def __init__(self, claim: Claim, store: WorkflowStore, checkpoint: Checkpoint) -> None:
        self.claim = claim  # learns of a cancel or a pause from a commit's answer
        self.store = store
        self.progress = Progress(checkpoint, claim.claimed.revision)
        # The claim's one checkpoint and lock (Progress never replaces them), read at
        # every step by the calls, the cursor and the boundary: attributes, not properties.
        self.checkpoint: Checkpoint = checkpoint
        self.lock: threading.RLock = self.progress.lock

    @property
    def revision(self) -> int:
        return self.progress.revision

    def encode(self) -> CheckpointWrite:
        """What changed in the checkpoint since the store last took it, its run time
        brought up to now."""
        with self.lock:
            self.progress.tick()
            return self.checkpoint.write(self.claim.lease.task_id, self.claim.max_entry_bytes)

    def encode_next_run(self) -> tuple[int, CheckpointWrite]:
        """The number and head of the run a ``continue_as_new`` starts (its journal is
        empty), the run time of this one brought up to now."""
        with self.lock:
            self.progress.tick()
            following = self.checkpoint.next_run()
            return following.run, following.write(self.claim.lease.task_id, self.claim.max_entry_bytes)

    def commit(self, subject: str = "") -> None:
        """Commit the checkpoint; ``subject`` (the call id it records) names the commit
        for crash points."""
        self._write(
            lambda write: self.store.commit_checkpoint(
                self.claim.lease, self.revision, write.head_json, journal=write.journal
            ),
            subject,
        )

    def commit_event(self, key: str, value_json: str) -> None:
        """Publish event ``key`` in a commit of the checkpoint as it stands (a result held
        back included), named ``event:<key>`` for crash points. A store that does not
        answer ends the cycle through user code (``Unwind``): swallowed by an ``except``
        in the main function, the event would be lost, since replay skips a call that
        later entries of the journal were recorded after."""
        try:
            self._write(
                lambda write: self.store.commit_event(
                    self.claim.lease, self.revision, write.head_json, key, value_json, journal=write.journal
                ),
                f"event:{key}",
            )
        except StoreUnavailable as exc:
            raise Unwind(exc) from exc

    def commit_attributes(self, attributes: Sequence[Attribute]) -> None:
        """Set search attributes in a commit of the checkpoint as it stands, named
        ``attributes:<key>+<key>...`` for crash points; as :meth:`commit_event`, a store that does
        not answer ends the cycle (``Unwind``)."""
        try:
            self._write(
                lambda write: self.store.commit_attributes(
                    self.claim.lease, self.revision, write.head_json, attributes, journal=write.journal
                ),
                "attributes:" + "+".join(a.key for a in attributes),
            )
        except StoreUnavailable as exc:
            raise Unwind(exc) from exc

    def commit_stream(self, write: StreamWrite) -> None:
        """Append a stream value in a commit of the checkpoint as it stands, named
        ``stream:<key>:<seq>`` for crash points; as :meth:`commit_event`, a store that
        does not answer ends the cycle (``Unwind``)."""
        try:
            self._write(
                lambda head: self.store.commit_stream(
                    self.claim.lease, self.revision, head.head_json, write, journal=head.journal
                ),
                f"stream:{write.key}:{write.seq}",
            )
        except StoreUnavailable as exc:
            raise Unwind(exc) from exc

    def append_stream(self, call_id: str, key: str, value: Any, seq: int) -> None:
        """A step body's ``write_stream``: an append fenced by the lease, its place in the
        run being the step's call id and the write's seq. Named
        ``stream:<key>:<call id>:<seq>`` for crash points."""
        stream = StreamWrite(key, checks.stream_value(key, value), self.checkpoint.run, call_id, seq)
        subject = f"stream:{key}:{call_id}:{seq}"
        if crashpoints.ARMED:
            crashpoints.reached("before_commit", subject)
        self.store.append_stream(self.claim.lease, stream)
        if crashpoints.ARMED:
            crashpoints.reached("after_commit", subject)

    def consume_signal(self, signal: Signal, subject: str, *, accepted: bool, note: str) -> None:
        """Commit the checkpoint in the write that takes ``signal`` out of the pending
        ones (accepted by the wait ``subject``, or refused with ``note``)."""
        self._write(
            lambda write: self.store.consume_signal(
                self.claim.lease,
                self.revision,
                write.head_json,
                signal.signal_id,
                accepted=accepted,
                note=note,
                journal=write.journal,
            ),
            subject,
        )

    def defer(self, subject: str) -> None:
        """Hold back the commit of a result just recorded (caller holds the lock): it is
        made before the next body runs (``commit_unsaved``) or with the cycle's
        transition, which saves the last step of a run its own round trip."""
        self.progress.unsaved = subject

    def commit_unsaved(self) -> None:
        """Commit a result still held back, so nothing that ran is only in memory when the
        outside world is touched again. Checked under the lock: two branches reaching a
        boundary at once must not both commit it."""
        with self.lock:
            unsaved = self.progress.unsaved
            if unsaved is not None:
                self.commit(unsaved)

    def commit_transaction(self, subject: str, run: Callable[[Any], None]) -> None:
        """A ``@workflow.transaction()`` step: ``run(connection)`` (its body, recording
        its entry) and the fenced commit of what changed, in one store transaction, so
        the body's writes are durable exactly when its completion is."""
        with self.lock:
            with self.store.step_transaction() as tx:
                run(tx.connection)
                write = self._encoded()
                if crashpoints.ARMED:
                    crashpoints.reached("before_commit", subject)
                try:
                    committed = tx.commit_checkpoint(
                        self.claim.lease, self.revision, write.head_json, journal=write.journal
                    )
                except LeaseLostError as exc:
                    raise Unwind(exc) from exc
            self._stored(write, committed, subject)

    def _encoded(self) -> CheckpointWrite:
        try:
            return self.encode()
        except CheckpointError as exc:
            raise FailRequested(str(exc), cause="checkpoint", error=exc) from exc

    def _write(self, store: Callable[[CheckpointWrite], Committed], subject: str) -> None:
        """Encode what changed and make one fenced write of it; keeps the new revision."""
        with self.lock:
            write = self._encoded()
            if crashpoints.ARMED:
                crashpoints.reached("before_commit", subject)
            try:
                committed = store(write)
            except LeaseLostError as exc:
                raise Unwind(exc) from exc
            self._stored(write, committed, subject)

    def _stored(self, write: CheckpointWrite, committed: Committed, subject: str) -> None:
        """The checkpoint as the store now has it (caller holds the lock)."""
        self.checkpoint.stored(write)
        self.progress.revision = committed.revision
        if committed.cancel_requested is not None:
            self.claim.cancel = True
        if committed.paused is not None:
            self.claim.pause = True
        self.progress.unsaved = None
        if crashpoints.ARMED:
            crashpoints.reached("after_commit", subject)
