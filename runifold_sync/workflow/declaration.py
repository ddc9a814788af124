"""Authoring: a ``Workflow`` is a main function built from named steps and effects.

Step ids are schema: they are written into checkpoints, so the decorators fix them at
import time and the fingerprint of a definition is computed from them.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from ..errors import InvalidArgument
from ..model import validate
from ..model.checkpoint import EntryKind
from ..model.retry_policy import RetryPolicy
from .context import WorkflowContext, call_step, patch_id
from .specs import StepSpec, input_type
from .step_context import StepContext

if TYPE_CHECKING:
    from ..model.effects import EffectEvidence

P = ParamSpec("P")
R = TypeVar("R")


class Workflow:
    """A named, versioned workflow. Create one per version; old versions stay importable
    while tasks still reference them."""

    def __init__(self, name: str, version: int, *, signals: Iterable[str] = ()) -> None:
        self.name = validate.name("workflow name", name)
        self.version = validate.version("version", version)
        # Signal names are an application contract, like step ids: part of the identity.
        self.signals = validate.names("signals", signals, kind="signal name")
        self.steps: dict[str, StepSpec] = {}
        self.compensations: dict[str, Callable[..., Any]] = {}
        # Steps whose compensation is also given the step's arguments (recorded with them).
        self.compensation_args: set[str] = set()
        # Update name (a declared signal) -> its validator (``validator``): run by the
        # wait before an update is recorded; raising rejects it.
        self.validators: dict[str, Callable[[Any], object]] = {}
        self.main_fn: Callable[..., Any] | None = None
        self._fingerprint: str | None = None  # cleared by each declaration

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, version={self.version})"

    def step(
        self,
        step_id: str | None = None,
        *,
        retry: RetryPolicy | None = None,
        capabilities: Iterable[str] = (),
        timeout: timedelta | None = None,
        patch: str | None = None,
    ) -> Callable[[Callable[Concatenate[StepContext, P], R]], Callable[Concatenate[WorkflowContext, P], R]]:
        """Declare a deterministic step; its output is checkpointed and replayed.
        ``timeout`` bounds each attempt of its body: one that runs longer loses its task
        and counts as a failed attempt of ``retry`` (see ``timeouts.py``). ``patch``: the
        step is called only on the new path of ``ctx.patched(patch)``, so adding it is a
        compatible change (it is left out of the fingerprint)."""
        return self._declare(EntryKind.STEP, step_id, retry, capabilities, True, None, timeout, patch=patch)

    def effect(
        self,
        effect_id: str | None = None,
        *,
        idempotent: bool,
        reconcile: Callable[..., EffectEvidence] | None = None,
        retry: RetryPolicy | None = None,
        capabilities: Iterable[str] = (),
        timeout: timedelta | None = None,
        patch: str | None = None,
    ) -> Callable[[Callable[Concatenate[StepContext, P], R]], Callable[Concatenate[WorkflowContext, P], R]]:
        """Declare an external write (``patch`` as for :meth:`step`). ``idempotent`` must
        be stated: it decides whether an interrupted call may run again or must be
        reconciled. An attempt that overruns
        ``timeout`` is an interrupted call too: reconciled, run again only when that is
        safe, else failed closed as ambiguous."""
        validate.flag("idempotent", idempotent)
        if reconcile is not None and not callable(reconcile):
            validate.refuse("reconcile", "callable", reconcile)
        return self._declare(
            EntryKind.EFFECT, effect_id, retry, capabilities, idempotent, reconcile, timeout, patch=patch
        )

    def transaction(
        self,
        step_id: str | None = None,
        *,
        retry: RetryPolicy | None = None,
        capabilities: Iterable[str] = (),
    ) -> Callable[[Callable[Concatenate[StepContext, P], R]], Callable[Concatenate[WorkflowContext, P], R]]:
        """Declare a step whose body writes to the store's own database through
        ``ctx.connection``, in the same transaction that records its completion: its
        writes and its checkpoint commit together, so it takes effect exactly once,
        whatever crashes (a crash or a lost lease before that commit rolls its writes
        back, and it runs again; after it, never). Keep it short: the transaction holds
        its locks (on SQLite, the database's write lock) while the body runs."""
        return self._declare(
            EntryKind.STEP, step_id, retry, capabilities, True, None, None, transactional=True
        )

    def compensate_for(
        self, step_id: str, *, with_args: bool = False
    ) -> Callable[[Callable[..., None]], Callable[..., None]]:
        """Declare how to undo a completed step ``step_id`` when the task later fails or is
        cancelled: ``fn(ctx, step_output)``. Compensations run newest first, each one
        checkpointed, so a crash in the middle resumes where it stopped.

        ``with_args=True``: ``fn(ctx, step_output, *args, **kwargs)`` with the arguments
        the step was called with, recorded (as JSON, so they must be JSON values) when it
        completes and structured back by the step's annotations; part of the
        fingerprint, since checkpoints then hold them."""
        validate.name("step id", step_id)
        validate.flag("compensate_for with_args", with_args)

        def decorate(fn: Callable[..., None]) -> Callable[..., None]:
            _check_function(f"@workflow.compensate_for({step_id!r})", fn)
            if step_id in self.compensations:
                raise InvalidArgument(f"{self!r} already has a compensation for {step_id!r}")
            self.compensations[step_id] = fn
            if with_args:
                self.compensation_args.add(step_id)
            self._fingerprint = None
            return fn

        return decorate

    def validator(self, name: str) -> Callable[[Callable[[Any], R]], Callable[[Any], R]]:
        """Declare the validator of update ``name`` (a declared signal), for
        ``ctx.wait_for_update``: called with the update's payload (structured as the
        wait's ``payload_type``) before the update is recorded; raising (any exception)
        rejects it, and the caller's ``store.update`` raises :class:`UpdateRejected` with
        the message. It must not touch the outside world: it runs again on a replay of
        the wait, never recorded."""
        validate.name("update name", name)
        if name not in self.signals:
            raise InvalidArgument(
                f"update {name!r} must be a signal {self!r} declares (signals=[...]); "
                f"it declares {sorted(self.signals)}"
            )
        if name in self.validators:
            raise InvalidArgument(f"update {name!r} of {self!r} already has a validator")

        def register(fn: Callable[[Any], R]) -> Callable[[Any], R]:
            if not callable(fn):
                validate.refuse(f"the validator of update {name!r}", "callable", fn)
            self.validators[name] = fn
            return fn

        return register

    def main(self, fn: Callable[..., R]) -> Callable[..., R]:
        """Declare the entry point ``fn(ctx, input)``; it is replayed from the top on
        every claim, so it must only branch on step outputs and its input."""
        _check_function("@workflow.main", fn)
        params = list(inspect.signature(fn).parameters.values())
        if len(params) != 2:
            raise InvalidArgument(
                f"workflow main {fn.__qualname__} must take (ctx, input), got {len(params)} parameters"
            )
        if self.main_fn is not None:
            raise InvalidArgument(f"{self!r} already has a main function")
        self.main_fn = fn
        return fn

    def input_type(self) -> Any:
        assert self.main_fn is not None
        return input_type(self.main_fn)

    def fingerprint(self) -> str:
        """Hash of the declared step graph; changes whenever a checkpoint of this
        version could be misread. Cached: the worker asks at every claim.

        Steps and effects declared with ``patch=`` (and their compensations) are left
        out: they are called only on a patch's new path, which a run enters by recording
        the patch's marker, so no checkpoint of the code before the patch can hold them,
        and a worker on that older code that meets the marker hands the task back
        (``replay.py``) rather than misread it. So a change guarded by a patch keeps the
        fingerprint, and the tasks in flight go on under the new code."""
        if self._fingerprint is not None:
            return self._fingerprint
        unpatched = [s for s in self.steps.values() if s.patch is None]
        schema = {
            "name": self.name,
            "version": self.version,
            "steps": sorted((s.schema() for s in unpatched), key=lambda s: s["id"]),
            "signals": sorted(self.signals),
            "compensations": sorted(
                sid for sid in self.compensations if sid not in self.steps or self.steps[sid].patch is None
            ),
        }
        if self.compensation_args:  # only then: every other fingerprint stays as it was
            schema["compensations_with_args"] = sorted(self.compensation_args)
        digest = hashlib.sha256(json.dumps(schema, sort_keys=True).encode())
        self._fingerprint = digest.hexdigest()[:16]
        return self._fingerprint

    @property
    def patches(self) -> frozenset[str]:
        """The change ids its steps and effects are declared under (``patch=``)."""
        return frozenset(s.patch for s in self.steps.values() if s.patch is not None)

    def _declare(
        self,
        kind: EntryKind,
        step_id: str | None,
        retry: RetryPolicy | None,
        capabilities: Iterable[str],
        idempotent: bool,
        reconcile: Callable[..., EffectEvidence] | None,
        timeout: timedelta | None,
        *,
        transactional: bool = False,
        patch: str | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        if callable(step_id):
            raise InvalidArgument(f"use @workflow.{kind}() with parentheses")
        if retry is not None and not isinstance(retry, RetryPolicy):
            validate.refuse("retry", "a RetryPolicy", retry)
        checked_timeout = validate.optional(validate.positive_duration)("timeout", timeout)
        caps = validate.names("capabilities", capabilities, kind="capability")
        if patch is not None:
            patch_id(patch)
        if step_id is not None:  # refused at the call that named it, not at decoration
            _check_step_id(kind, step_id)

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            _check_function(f"@workflow.{kind}()", fn)
            sid = _check_step_id(kind, step_id if step_id is not None else fn.__name__)
            if sid in self.steps:
                raise InvalidArgument(f"{self!r} already declares a step or effect {sid!r}")
            spec = StepSpec(
                sid,
                kind,
                fn,
                retry or RetryPolicy(),
                caps,
                idempotent,
                reconcile,
                checked_timeout,
                transactional,
                patch,
            )
            self.steps[sid] = spec
            self._fingerprint = None

            def call(ctx: WorkflowContext, *args: Any, **kwargs: Any) -> Any:
                return call_step(ctx, spec, args, kwargs)

            call.__name__ = fn.__name__
            call.__qualname__ = fn.__qualname__
            call.__doc__ = fn.__doc__
            call.__wrapped__ = fn  # type: ignore[attr-defined]
            return call

        return decorate


def _check_function(decorator: str, fn: object) -> None:
    """What a decorator is applied to is called later, by a worker: a value that is not
    a function is refused here, where it was written, not when a task reaches it."""
    if not callable(fn):
        raise InvalidArgument(f"{decorator} must decorate a function, got {validate.shown(fn)}")


def _check_step_id(kind: EntryKind, step_id: str) -> str:
    """A step id is schema (it names checkpoint entries): a plain, non-empty name."""
    sid = validate.name(f"{kind} id", step_id)
    if "#" in sid or "/" in sid:
        raise InvalidArgument(f"{kind} id may not contain '#' or '/', got {validate.shown(sid)}")
    return sid
