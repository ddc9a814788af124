"""What a pool's new child does first, alone in a process, for the crash-point table of
the dead worker's hand-back: ``python -m tests.system.hand_back_app --url URL
--worker-id ID --pid PID`` hands back the leases of worker ``ID`` (process ``PID``, gone)
as ``supervisor.hand_back_dead_worker`` does, and prints the task ids handed back. With
``RUNIFOLD_CRASH_AT`` armed it dies (SIGKILL) on the way."""

from __future__ import annotations

import argparse

from runifold_sync import open_store
from runifold_sync.pool.supervisor import hand_back_dead_worker


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.system.hand_back_app")
    parser.add_argument("--url", required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--pid", type=int, required=True)
    args = parser.parse_args()
    with open_store(args.url) as store:
        handed = hand_back_dead_worker(store, args.worker_id, args.pid, "was killed by SIGKILL")
    print(" ".join(handed), flush=True)


if __name__ == "__main__":
    main()
