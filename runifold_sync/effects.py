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
