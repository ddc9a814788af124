"""A pool started from an ``App``: ``python -m tests.app.app_pool_app URL N``.

The App starts ``N`` tasks first, so its store is open when ``app.run_pool`` is called:
the pool must close it before it forks (else ``ForkUnsafe``), and each child opens its
own. Each step notes its process id in the result, so the test sees which processes ran
the tasks. On SIGTERM the pool stops; the process then prints the report and, through
the same App (its store opened again), every task's result, as JSON lines.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from runifold_sync import App

app = App(sys.argv[1] if len(sys.argv) > 1 else None)
work = app.workflow("app-pool")


@work.step()
def note_pid(ctx: Any, n: int) -> int:
    return os.getpid()


@work.main
def main(ctx: Any, n: int) -> dict[str, int]:
    return {"n": n, "pid": note_pid(ctx, n)}


def run(count: int) -> None:
    handles = [app.start("app-pool", n, task_id=f"t{n}") for n in range(count)]
    print(json.dumps({"started": os.getpid()}), flush=True)
    report = app.run_pool(concurrency=2, worker_id="apppool")
    print(json.dumps({"outcomes": report.outcomes, "per_worker": report.per_worker}), flush=True)
    print(json.dumps([h.result() for h in handles]), flush=True)
    app.close()


if __name__ == "__main__":
    run(int(sys.argv[2]))
