"""``python -m runifold_sync``: a thin click layer over the library."""
