"""A supervised pool of worker processes, and the processes started beside it."""
