"""The testing kit: run workflows to their end inside a test, in milliseconds.

``run_until_idle(store, registry)`` runs every claimable task in the test's process and
skips store time to each timer, so a workflow that sleeps a day or waits two days for an
approval ends at once; ``send_signal``, ``approve``, ``journal`` and ``result`` act on a
task between runs and read it after. The pytest plugin (``runifold_sync.testing.plugin``,
registered as the ``pytest11`` entry point ``runifold``) adds the ``runifold_store``
fixture, a fresh store per test, and ``runifold_clock``, its :class:`StoreClock`.
``replay(history, registry)`` replays a run exported with ``show TASK --export`` against
the code under test, running nothing, and raises ``NonDeterminism`` where it diverges.
"""

from ..worker.until_idle import NotIdle, run_until_idle, unfinished
from .clock import StoreClock
from .helpers import approve, journal, result, send_signal
from .replay import replay

__all__ = [
    "NotIdle",
    "StoreClock",
    "approve",
    "journal",
    "replay",
    "result",
    "run_until_idle",
    "send_signal",
    "unfinished",
]
