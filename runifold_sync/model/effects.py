"""Evidence about an external write whose outcome the checkpoint does not know."""

from __future__ import annotations

import enum
from typing import Any

import attrs


class EffectStatus(enum.StrEnum):
    APPLIED = "applied"
    NOT_APPLIED = "not_applied"
    UNKNOWN = "unknown"


@attrs.frozen
class EffectEvidence:
    """What a ``reconcile`` function found out. Only ``applied`` and ``not_applied`` let
    the task go on; ``unknown`` fails it closed as ambiguous."""

    status: EffectStatus
    result: Any = None

    @classmethod
    def applied(cls, result: Any = None) -> EffectEvidence:
        return cls(EffectStatus.APPLIED, result)

    @classmethod
    def not_applied(cls) -> EffectEvidence:
        return cls(EffectStatus.NOT_APPLIED)

    @classmethod
    def unknown(cls) -> EffectEvidence:
        return cls(EffectStatus.UNKNOWN)


# How an effect's recorded result became known: the ``evidence`` of its journal entry,
# written by the engine (``calls.py``) and read back for ``show`` (:func:`read_evidence`).
# Journals keep these texts, so they stay as they are.
RAN = "ran"  # its body ran and returned the result
RECONCILED = "reconciled"  # its reconcile found it applied and gave the result
_RESOLVED = "resolved by "  # + "actor: reason": an operator's resolution gave the result
_RERUN = "re-run as not applied, "  # + either of the two above, found not applied: it ran again
RERUN_RECONCILED = _RERUN + RECONCILED


def resolved(actor: str, reason: str, *, applied: bool) -> str:
    """The evidence of an effect an operator resolved (``store.resolve_effect``)."""
    text = f"{_RESOLVED}{actor}: {reason}"
    return text if applied else _RERUN + text


def came_from(evidence: str) -> str:
    """How an error says where an effect's recorded result came from."""
    if evidence == RECONCILED:
        return "was reconciled as applied with the result"
    if evidence.startswith(_RESOLVED):
        return "was resolved as applied with the result"
    return "returned"


@attrs.frozen
class ReadEvidence:
    """An effect's evidence read back: ``how`` its result became known (``ran``,
    ``reconciled``, ``resolved``; ``other`` for a text this release does not write),
    whether the reconcile or resolution found it applied (False: it was then run again),
    and who resolved it and why."""

    how: str
    text: str
    applied: bool | None = None
    by: str | None = None
    reason: str | None = None

    @property
    def ran(self) -> bool:
        """The result is what the body returned: it ran, at first or again."""
        return self.how == "ran" or self.applied is False


def read_evidence(text: str, resolutions: list[tuple[str, str]] | None = None) -> ReadEvidence:
    """``text`` (a journal entry's evidence) as what it says. ``resolutions``, the
    (actor, reason) pairs the task's history recorded for the effect, tell an actor
    whose name holds ``": "`` from its reason; without a match the first ``": "`` ends
    the actor."""
    if text == RAN:
        return ReadEvidence("ran", text)
    rest = text.removeprefix(_RERUN)
    applied = rest == text
    if rest == RECONCILED:
        return ReadEvidence("reconciled", text, applied)
    if not rest.startswith(_RESOLVED):
        return ReadEvidence("other", text)
    decided = rest.removeprefix(_RESOLVED)
    for actor, reason in resolutions or []:
        if decided == f"{actor}: {reason}":
            return ReadEvidence("resolved", text, applied, actor, reason)
    actor, _, reason = decided.partition(": ")
    return ReadEvidence("resolved", text, applied, actor, reason)
