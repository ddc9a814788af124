"""Values every layer shares: tasks, budgets, outcomes, the codec, the journal format,
schedules, retry policy and the checks of values where they enter. Imports nothing of
the package but :mod:`runifold_sync.errors`."""
