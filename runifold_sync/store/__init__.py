"""Stores: the durable control plane. ``base`` is the contract both backends honour."""
