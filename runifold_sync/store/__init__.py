"""Stores: the durable control plane. ``base`` is the contract, each operation written
once over a ``dialect``; ``sqlite`` and ``postgres`` are the two dialects."""
