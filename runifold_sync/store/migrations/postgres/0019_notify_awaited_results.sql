-- Version 19: a task's end is NOTIFYed on runifold_results only when someone waits for
-- it. A waiter (store.wait_for_task, store.get_event) sets result_awaited once it
-- listens and before it reads the task again; the transitions that end a task call
-- pg_notify only when they find it set. A NOTIFY on every completion took the server's
-- notification queue lock at each commit, serializing a pool's completions, and woke
-- every listening backend of the database: without it a pool of 4 drained one-step tasks
-- 1.25x as fast on 2 cores (benchmarks/ab.py, 4 rounds interleaved). Adding a column
-- with a constant default rewrites no row.
ALTER TABLE runifold_tasks ADD COLUMN result_awaited boolean NOT NULL DEFAULT false;
