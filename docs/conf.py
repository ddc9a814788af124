"""Sphinx configuration of the runifold_sync documentation site.

Build it warning-free (the CI command; ``-n`` makes every unresolved reference a warning
and ``-W`` every warning an error)::

    .venv/bin/python -m sphinx -W --keep-going -n -b html docs docs/_build/html

Sphinx reads the docstrings the package already writes (they use Sphinx roles) through
autodoc, the command line through sphinx-click (from the click commands themselves, so
it cannot drift), and the pages through MyST, which is Markdown: the README and the
pages share one syntax, and Sybil runs the examples of both (``conftest.py``).
"""

from __future__ import annotations

import runifold_sync

project = "runifold_sync"
author = "the runifold_sync authors"
copyright = "the runifold_sync authors"
release = getattr(runifold_sync, "__version__", "0.1.0")

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx_click",
]

source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "README.md"]
root_doc = "index"

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# The API reference: members in source order, signatures with their annotations, and the
# docstrings of the classes and their __init__ together.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autoclass_content = "class"
autodoc_default_options = {"members": True, "show-inheritance": True}

nitpicky = True

html_theme = "furo"
html_title = "runifold_sync"
html_static_path: list[str] = []


def _errors_on_their_own_page(app, what, name, obj, skip, options):  # type: ignore[no-untyped-def]
    """The root module re-exports the errors; they are documented once, with
    ``runifold_sync.errors`` on the errors page, where references to them resolve."""
    documenting = app.env.temp_data.get("autodoc:module")
    if documenting != "runifold_sync.errors" and isinstance(obj, type) and issubclass(obj, BaseException):
        return True
    return None


def setup(app):  # type: ignore[no-untyped-def]
    app.connect("autodoc-skip-member", _errors_on_their_own_page)
