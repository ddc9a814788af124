"""Named crash points: SIGKILL (or pause) this process at an exact place in the lease protocol.

For tests of what survives a crash. Enabled only by the environment variable
``RUNIFOLD_CRASH_AT``, read at import (and again by :func:`read_environment`); when it
is unset, ``ARMED`` is empty and each hook in the library is one ``if
crashpoints.ARMED:`` test. The value is a comma separated list of ``point`` or
``point:subject``; a point with a subject fires only for that subject::

    RUNIFOLD_CRASH_AT=after_claim
    RUNIFOLD_CRASH_AT=before_commit:reserve#1          # before the commit recording reserve#1
    RUNIFOLD_CRASH_AT=after_commit:charge#1:intent     # the effect's intent is durable
    RUNIFOLD_CRASH_AT=before_commit:event:stage        # ctx.set_event("stage", ...) not yet stored
    RUNIFOLD_CRASH_AT=after_commit:fetch#1:deadline    # a timed step's deadline is durable
    RUNIFOLD_CRASH_AT=after_effect:charge#1,before_heartbeat
    RUNIFOLD_CRASH_AT=before_transition:retry          # before a failed step's retry is stored

Together the points bracket every fenced write a worker makes (claims, checkpoint
commits, signal consumption included, heartbeats, and each write that ends a claim),
every step and effect body, and the creation of a schedule's tick.

The process writes one line naming the point to stderr, then kills itself with SIGKILL:
no ``finally`` block, ``atexit`` handler or buffered write runs, as in a real crash.

With ``RUNIFOLD_CRASH_PAUSE=<path>`` also set, an armed point pauses instead: the thread
that reached it waits until the file at ``path`` exists, then carries on. The other
threads keep running (the heartbeat goes on extending the lease), so a test can freeze
the process there with SIGSTOP, let the lease lapse and another worker take over, and
then see the write that was about to be sent reach the store as a stale owner's::

    RUNIFOLD_CRASH_AT=before_commit:s3#1 RUNIFOLD_CRASH_PAUSE=/tmp/go
"""

from __future__ import annotations

import os
import signal
import time

from ..errors import InvalidArgument

ENV_VAR = "RUNIFOLD_CRASH_AT"
PAUSE_ENV_VAR = "RUNIFOLD_CRASH_PAUSE"
PAUSE_LIMIT_S = 600.0  # a pause nobody releases ends as the crash, so no orphan waits forever

# point -> what its subject is
POINTS = {
    "before_claim": "worker id; a claim is about to be sent (claims made by a completion "
    "are part of the complete transition)",
    "after_claim": "task id; a claim returned the lease, nothing ran under it yet",
    "before_step": "call id; a step body is about to run",
    "after_step": "call id; a step body returned, its output is not committed",
    "before_effect": "call id; an effect's intent is committed, its body is about to run",
    "after_effect": "call id; an effect body returned, its result is not committed",
    "completion_held": "task id; the task returned and its completion is held for its claim "
    "batch's one commit (batch.py), which has not been sent",
    "before_commit": "call id (effect intents: '<call id>:intent'; events: 'event:<key>'; the "
    "deadline of a step or effect with a timeout, committed before its body: '<call id>:deadline'; "
    "a step's final failure, before StepFailed is raised: '<call id>:failed'; a body's heartbeat "
    "details: '<call id>:heartbeat'; what a ctx.wait_any fired: 'any#<n>'; search attributes: "
    "'attributes:<key>+<key>...' in the call's order; stream values: 'stream:<key>:<seq>', and from a "
    "step body, a write apart from any commit, 'stream:<key>:<call id>:<seq>'); "
    "a checkpoint commit is about to be sent",
    "after_commit": "as before_commit; the commit returned",
    "before_heartbeat": "task id, of the running task or of one claimed ahead; a lease "
    "extension is about to be sent",
    "after_heartbeat": "as before_heartbeat; the lease extension returned",
    "before_transition": "complete, suspend, fail, retry, continue (continue_as_new), cancel "
    "(acknowledging a cancel request), yield (step slice used up), unavailable (definition "
    "not registered here), hand_back (a task claimed ahead given back unstarted), "
    "complete_batch (the held completions of a claim batch) or hand_back_dead (a pool child "
    "handing back the leases of its slot's dead predecessor); the write that ends a claim is "
    "about to be sent",
    "after_transition": "as before_transition; the write returned",
    "before_tick": "schedule name; the transaction creating a due tick's task (and recording "
    "the tick) is about to be sent, from the worker's schedule thread",
    "after_tick": "as before_tick; the transaction returned",
    "within_operator": "fork, resume_cancelled, retry_batch or cancel_batch (a batch of retry or "
    "cancel by filter) or upgrade (one task moved to a newer version); an operator's repair "
    "has made its changes in its transaction, which has not committed",
    "after_operator": "as within_operator; the transaction committed",
    "bulk_enqueue": "task id of the first of a run of enqueued tasks without flow options; inside "
    "the enqueue's transaction, the run's tasks and events written in one go, not committed",
    "flow_enqueue": "debounce key, or the dedup key of a singleton replacing its task; inside "
    "the enqueue's transaction, the debounced input folded into the key's queued task (or the "
    "replaced task cancelled), not committed",
}


def parse(text: str) -> dict[str, frozenset[str] | None]:
    """``point[:subject]`` items -> {point: subjects, or None for any subject}."""
    armed: dict[str, set[str] | None] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        point, _, subject = item.partition(":")
        if point not in POINTS:
            raise InvalidArgument(
                f"{ENV_VAR} names unknown crash point {point!r}; known points: {', '.join(POINTS)}"
            )
        if not subject:
            armed[point] = None
        elif armed.get(point, set()) is not None:
            subjects = armed.setdefault(point, set())
            assert subjects is not None
            subjects.add(subject)
    return {point: None if s is None else frozenset(s) for point, s in armed.items()}


ARMED: dict[str, frozenset[str] | None] = {}
PAUSE_UNTIL: str | None = None


def read_environment() -> None:
    """Arm the points ``RUNIFOLD_CRASH_AT`` names now. Import does this once; a process
    forked from a parent that imported the package before the variable was set (the test
    suite's pre-imported parent, ``tests/support/zygote.py``) calls it again."""
    global ARMED, PAUSE_UNTIL
    ARMED = parse(os.environ.get(ENV_VAR, ""))
    PAUSE_UNTIL = os.environ.get(PAUSE_ENV_VAR) or None


read_environment()


def transition(kind: str) -> _Transition:
    """Bracket a write that ends a claim with its two crash points, as in
    ``with crashpoints.transition("complete"): store.complete(...)``: ``before_transition``
    as the block starts and ``after_transition`` once it ends without an exception (a
    refused or failed write never reached its "after"). ``kind`` names the write, as
    listed under ``before_transition`` in ``POINTS``."""
    return _Transition(kind)


class _Transition:
    """A class rather than a generator: an unarmed process pays for one small object and
    two truth tests per transition."""

    __slots__ = ("kind",)

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __enter__(self) -> None:
        if ARMED:
            reached("before_transition", self.kind)

    def __exit__(self, exc_type: type[BaseException] | None, *_exc: object) -> None:
        if ARMED and exc_type is None:
            reached("after_transition", self.kind)


def reached(point: str, subject: str = "") -> None:
    """Kill this process (or pause this thread, see ``RUNIFOLD_CRASH_PAUSE``) if ``point``
    (for ``subject``) is armed. Callers test ``ARMED`` first, so an unarmed process never
    gets here."""
    if point not in ARMED:
        return
    subjects = ARMED[point]
    if subjects is not None and subject not in subjects:
        return
    pid = os.getpid()
    if PAUSE_UNTIL is None:
        os.write(2, f"runifold crash point {point}:{subject} reached in pid {pid}\n".encode())
        os.kill(pid, signal.SIGKILL)
        return
    os.write(2, f"runifold crash point {point}:{subject} paused in pid {pid}\n".encode())
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while not os.path.exists(PAUSE_UNTIL):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    os.write(2, f"runifold crash point {point}:{subject} resumed in pid {pid}\n".encode())
