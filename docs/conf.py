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

import functools
import importlib
import pkgutil

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
autodoc_default_options = {"members": True, "undoc-members": True}

nitpicky = True
# Types of the standard library and of other projects appear in signatures; their own
# documentation is not part of this site (and is not fetched: the build needs no
# network), so a reference to one is no broken link.
nitpick_ignore_regex = [
    ("py:class", r"(datetime|collections\.abc|contextlib|typing|enum|abc|os|pathlib|sqlite3)\..*"),
    ("py:class", r"(flask|django|werkzeug|psycopg|psycopg_pool|opentelemetry|click|attrs)\..*"),
    ("py:class", r"TracerProvider|timedelta|datetime"),
    ("py:class", r"P|R|T|(.*\.)?[PRT]"),  # type variables
]

html_theme = "furo"
html_title = "runifold_sync"
html_static_path: list[str] = []


def _public_or_internal(app, env, node, contnode):  # type: ignore[no-untyped-def]
    """Objects are documented where the public imports them (``runifold_sync.WorkerId``),
    while signatures and docstrings name them where they are defined
    (``runifold_sync.model.values.WorkerId``) or by their short name: such a reference goes
    to the public entry. One to an internal object that exists but is not part of the
    public reference (a module, a record a signature mentions) is shown without a link; a
    name that exists nowhere stays a warning."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip(".~")
    kind = node["reftype"]
    py = env.get_domain("py")
    short = target.rsplit(".", 1)[-1]
    candidates = [f"runifold_sync.{short}", f"runifold_sync.errors.{short}"]
    if node.get("py:class"):
        candidates.insert(0, f"runifold_sync.{node['py:class'].rsplit('.', 1)[-1]}.{target}")
    if "." in target and not target.startswith("runifold_sync."):
        candidates.insert(0, f"runifold_sync.{target}")
    for candidate in candidates:
        found = py.resolve_xref(env, node["refdoc"], app.builder, kind, candidate, node, contnode)
        if found is not None:
            return found
    return contnode if _exists_in_package(target) else None


@functools.cache
def _package_modules() -> tuple[str, ...]:
    modules = pkgutil.walk_packages(runifold_sync.__path__, "runifold_sync.")
    return tuple(m.name for m in modules if not m.name.endswith("__main__"))  # that one runs the CLI


def _exists_in_package(target: str) -> bool:
    for module_name in _package_modules():
        if module_name == target or module_name.endswith("." + target):
            return True
        module = importlib.import_module(module_name) if module_name.startswith("runifold_sync.") else None
        head, _, attr = target.rpartition(".")
        if module is not None and (head in ("", module_name) or module_name.endswith("." + head)):
            if hasattr(module, attr):
                return True
    return False


def _errors_on_their_own_page(app, what, name, obj, skip, options):  # type: ignore[no-untyped-def]
    """The errors are documented once, on the errors page (``runifold_sync.errors``), not
    again where the package root re-exports them."""
    documenting = app.env.temp_data.get("autodoc:module")
    # type(obj), not isinstance: a lazy proxy (Django's settings) answers isinstance by
    # loading what it stands for.
    if documenting == "runifold_sync" and issubclass(type(obj), type) and issubclass(obj, BaseException):
        return True
    return None


def setup(app):  # type: ignore[no-untyped-def]
    app.connect("missing-reference", _public_or_internal)
    app.connect("autodoc-skip-member", _errors_on_their_own_page)
