"""Undoing completed steps after a task failed or was cancelled.

Completed calls that declare a compensation are listed in the checkpoint in completion
order (``Checkpoint.undo``, across the main function and its branches); they are undone
newest first, with a commit after each, so a crash in the middle resumes where it
stopped and never undoes a step twice.
"""

from __future__ import annotations

import inspect
import time
import typing
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..model.checkpoint import JournalEntry
from ..model.codec import structure
from ..workflow.specs import StepSpec
from ..workflow.step_context import StepContext
from .boundary import Boundary
from .calls import structured
from .interrupts import FailRequested

if TYPE_CHECKING:
    from ..workflow.declaration import Workflow


class Compensation:
    """The undo of one claim's task, run from its main journal."""

    def __init__(self, boundary: Boundary, workflow: Workflow) -> None:
        self._commits = boundary.commits
        self._boundary = boundary
        self._workflow = workflow

    def needed(self) -> bool:
        """True when a completed step has a declared compensation not yet run."""
        return any(True for _ in self._to_compensate())

    def run(self, cause: str, reason: str) -> None:
        """Undo completed steps newest first, committing after each. A compensation that
        raises fails the task as it is."""
        checkpoint = self._commits.checkpoint
        with self._commits.lock:
            starting = checkpoint.compensating_for is None
            if starting:
                checkpoint.compensating_for = cause
                checkpoint.compensation_reason = reason
        if starting:  # resuming commits only after an undo: a crashing one must not count as progress
            self._commits.commit()
        lease = self._boundary.claim.lease
        task_id, fence = lease.task_id, lease.fencing_token
        for entry, step_id in list(self._to_compensate()):
            self._boundary.claim.check_lease()
            spec = self._workflow.steps[step_id]
            call_id = f"compensate:{entry.call_id}"
            context = StepContext(task_id, call_id, 1, fence, checkpoint.idempotency_key(task_id, call_id))
            started = time.monotonic()
            output = structured(spec, entry.output)
            try:
                if step_id in self._workflow.compensation_args:
                    args, kwargs = self._arguments(entry.call_id, spec, reason)
                    self._workflow.compensations[step_id](context, output, *args, **kwargs)
                else:
                    self._workflow.compensations[step_id](context, output)
            except Exception as exc:
                with self._commits.lock:  # what it spent before raising was spent
                    self._boundary.account(steps=0, cost=context.cost, started=started)
                raise FailRequested(
                    f"{reason}; compensation of {entry.call_id} raised {type(exc).__name__}: {exc}",
                    cause="compensation_error",
                    error=exc,
                    step_id=step_id,
                ) from exc
            with self._commits.lock:
                self._boundary.account(steps=0, cost=context.cost, started=started)
                checkpoint.compensated.append(entry.call_id)
            self._commits.commit()

    def _arguments(self, call_id: str, spec: StepSpec, reason: str) -> tuple[list[Any], dict[str, Any]]:
        """The recorded arguments of ``call_id``, structured as its step's parameters are
        annotated. None recorded (the step completed before ``with_args`` was declared,
        under the same version) fails the undo rather than call it without them."""
        recorded = self._commits.checkpoint.compensation_args.get(call_id)
        if recorded is None:
            raise FailRequested(
                f"{reason}; compensation of {call_id} takes the step's arguments, but none were "
                "recorded for it",
                cause="compensation_error",
                step_id=spec.step_id,
            )
        raw_args, raw_kwargs = recorded
        hints = typing.get_type_hints(spec.fn)
        params = [
            p
            for p in list(inspect.signature(spec.fn).parameters.values())[1:]
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        args = [
            structure(raw, hints.get(params[n].name, Any)) if n < len(params) else raw
            for n, raw in enumerate(raw_args)
        ]
        kwargs = {name: structure(raw, hints.get(name, Any)) for name, raw in raw_kwargs.items()}
        return args, kwargs

    def _to_compensate(self) -> Iterator[tuple[JournalEntry, str]]:
        """Completed calls still to undo with their step ids, newest completion first."""
        checkpoint = self._commits.checkpoint
        if len(checkpoint.undo) == len(checkpoint.compensated):
            return
        entries = {entry.call_id: entry for entry in checkpoint.journal}
        for journal in checkpoint.branch_journals.values():
            entries.update((entry.call_id, entry) for entry in journal)
        for call_id in reversed(checkpoint.undo):
            if call_id not in checkpoint.compensated:
                yield entries[call_id], call_id.rsplit("/", 1)[-1].split("#")[0]
