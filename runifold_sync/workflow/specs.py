"""What a declared step or effect is: its id, body, policies and return type.

Kept apart from ``workflow.py`` (which declares them) so that the replay engine and the
``ctx`` facade can name a step without importing the authoring module that imports them.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import attrs

from ..errors import InvalidArgument
from ..model.checkpoint import EntryKind
from ..model.retry_policy import RetryPolicy

if TYPE_CHECKING:
    from ..model.effects import EffectEvidence


@functools.lru_cache(maxsize=4096)  # bounded: branch functions may be fresh closures
def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """Resolved once per function: steps are called on every replay, and resolving hints
    was a quarter of a step's CPU. A failure is not cached, so a forward reference that
    resolves later still works."""
    try:
        return typing.get_type_hints(fn)
    except Exception as exc:  # unresolvable forward reference: say which function
        raise InvalidArgument(f"cannot resolve type hints of {fn.__qualname__}: {exc}") from exc


def return_type(fn: Callable[..., Any]) -> Any:
    """The return annotation of ``fn`` (``Any`` without one): recorded outputs are
    structured back into it on replay."""
    return _type_hints(fn).get("return", Any)


@functools.lru_cache(maxsize=1024)
def input_type(main_fn: Callable[..., Any]) -> Any:
    """The annotation of a main function's input (its second parameter), read once: the
    signature was re-read on every claim."""
    name = list(inspect.signature(main_fn).parameters)[1]
    return _type_hints(main_fn).get(name, Any)


@attrs.frozen
class StepSpec:
    """One declared step or effect. ``output_type`` is resolved lazily so annotations may
    name classes defined after the decorator ran."""

    step_id: str
    kind: EntryKind = attrs.field(converter=EntryKind)  # STEP or EFFECT
    fn: Callable[..., Any]
    retry: RetryPolicy
    capabilities: frozenset[str]
    idempotent: bool = True
    reconcile: Callable[..., EffectEvidence] | None = None
    # How long one attempt of the body may run (``timeouts.py``). Like the retry policy,
    # it says how a body runs, not what its checkpoint means: no part of ``schema``.
    timeout: timedelta | None = None
    # ``@workflow.transaction()``: the body runs inside the store transaction that records
    # its completion. That changes what a recorded call means (its writes are in it), so
    # it is part of ``schema``, said only when set so other steps' fingerprints stay.
    transactional: bool = False
    # ``patch="change-id"``: the step is called only on the new path of ``ctx.patched``
    # with that id. No checkpoint written before the patch can hold it, so it is no part
    # of the definition's fingerprint (``Workflow.fingerprint``).
    patch: str | None = None

    @property
    def output_type(self) -> Any:
        return return_type(self.fn)

    def schema(self) -> dict[str, Any]:
        schema = {"id": self.step_id, "kind": str(self.kind), "idempotent": self.idempotent}
        return schema | {"transaction": True} if self.transactional else schema
