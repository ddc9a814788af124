"""The traceback a failure keeps: bounded, newest frames first to survive, and in a form
every store can hold.

A failed task's record (``FailureDetail.traceback``) and its ``failed`` history event
carry the traceback of the exception that ended it, so ``show`` says where a step broke
long after the worker's logs are gone. The record is read by everyone who looks at the
task and kept for as long as its history, so it is bounded to
:data:`MAX_TRACEBACK_BYTES` of UTF-8. What is cut is the oldest part: the innermost
frames and the exception's own line, at the end of a traceback, are what say what went
wrong, while the outer frames are mostly the engine's way down to the step. Each piece of
the traceback (a frame with its source line, the exception's line) is also held to
:data:`MAX_PIECE_BYTES`, so one huge exception message cannot push every frame out.
"""

from __future__ import annotations

import itertools
import traceback

from .codec import storable_text

MAX_TRACEBACK_BYTES = 4096
MAX_PIECE_BYTES = 1024


def kept_traceback(error: BaseException) -> str | None:
    """``error``'s traceback (its causes and contexts included) as the failure keeps it,
    or None when it was never raised: an error the engine built to name a condition
    (an ambiguous effect, a non-determinism) has no frames worth keeping."""
    if error.__traceback__ is None:
        return None
    pieces = [
        _bounded_piece(_storable(piece))
        for piece in traceback.TracebackException.from_exception(error).format()
    ]
    lines_before = list(itertools.accumulate((piece.count("\n") for piece in pieces), initial=0))
    size = 0
    for position in range(len(pieces) - 1, -1, -1):
        size += len(pieces[position].encode())
        marker = _marker(lines_before[position]) if position else ""
        if size + len(marker.encode()) > MAX_TRACEBACK_BYTES:  # the pieces after it fitted
            return _marker(lines_before[position + 1]) + "".join(pieces[position + 1 :])
    return "".join(pieces)


def _marker(lines_cut: int) -> str:
    return f"[{lines_cut} earlier lines of this traceback cut]\n"


def _storable(text: str) -> str:
    """``text`` as both stores keep it, alike: PostgreSQL's JSONB refuses U+0000 and lone
    surrogates, which an exception message may hold; they are written as escapes."""
    return storable_text(text.replace("\x00", "\\x00"))


def storable(text: str) -> str:
    """Free text as both stores keep it in JSON (see ``_storable``): for the message of a
    step's final failure, recorded in its journal entry."""
    return _storable(text)


def _bounded_piece(piece: str) -> str:
    encoded = piece.encode()
    if len(encoded) <= MAX_PIECE_BYTES:
        return piece
    cut = " [... cut]\n"
    head = encoded[: MAX_PIECE_BYTES - len(cut)].decode("utf-8", "ignore")
    return head.rstrip("\n") + cut
