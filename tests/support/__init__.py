"""What the test directories share: the backend fixtures, the store clock, the worker
factory, the ledger that subprocess apps write, the harness that starts, watches and
kills them, and the functions spawned processes run. ``tests/conftest.py`` registers
the fixtures for every directory."""
