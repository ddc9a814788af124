"""Finding the application's registry from a ``module:attribute`` reference, as the
``run`` and ``versions`` commands and the framework integrations do."""

from __future__ import annotations

import importlib
import os
import sys
import sysconfig
import traceback
from pathlib import Path

from .errors import AppNotLoaded, InvalidArgument
from .workflow.registry import WorkflowRegistry


def load_registry(reference: str) -> WorkflowRegistry:
    """Import ``module:attribute``; the attribute is a registry or a function returning
    one (a function lets the application build it after fork, in each worker). Any
    failure is :class:`AppNotLoaded`, one line (the exception the import raised is its
    ``__cause__``, traceback and all)."""
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise InvalidArgument(f"app reference must look like 'package.module:registry', got {reference!r}")
    searched = str(Path.cwd())
    if searched not in sys.path:
        sys.path.insert(0, searched)  # like `python -m`, find the app in the cwd
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            raise AppNotLoaded(_not_found(reference, exc.name, searched)) from exc
        raise AppNotLoaded(_raised(reference, f"importing {module_name!r}", exc)) from exc
    except Exception as exc:  # whatever the application's module raised, said in one line
        raise AppNotLoaded(_raised(reference, f"importing {module_name!r}", exc)) from exc
    try:
        target = getattr(module, attribute)
    except AttributeError as exc:
        raise AppNotLoaded(f"module {module_name!r} has no attribute {attribute!r}") from exc
    registry = target
    if callable(target) and not isinstance(target, WorkflowRegistry):
        try:
            registry = target()
        except Exception as exc:
            raise AppNotLoaded(_raised(reference, f"calling {attribute!r} of {module_name!r}", exc)) from exc
    if not isinstance(registry, WorkflowRegistry):
        raise AppNotLoaded(f"{reference!r} is not a WorkflowRegistry (got {type(registry).__name__})")
    return registry


def _not_found(reference: str, missing: str, searched: str) -> str:
    """The app's own module (or a package on its way) is not on the import path."""
    if "." not in missing:
        return (
            f"cannot import {missing!r} from app reference {reference!r}: no module {missing!r} in "
            f"{searched} (the directory this runs from) or elsewhere on the import path; run from "
            "the project's root, or add the directory that holds it to PYTHONPATH"
        )
    package, _, name = missing.rpartition(".")
    where = getattr(sys.modules.get(package), "__path__", None)
    inside = f" ({', '.join(where)})" if where else ""
    return (
        f"cannot import {missing!r} from app reference {reference!r}: "
        f"package {package!r}{inside} has no module {name!r}"
    )


def _raised(reference: str, doing: str, exc: Exception) -> str:
    """``doing`` (importing the app's module, calling its factory) raised ``exc``: where
    (file:line) and what, in one line."""
    if isinstance(exc, SyntaxError):
        where = f"{exc.filename}:{exc.lineno}"
        what = f"{type(exc).__name__}: {exc.msg}"
    else:
        where = _where(exc)
        what = " ".join(traceback.format_exception_only(exc)[-1].split())
    return f"{doing} (app reference {reference!r}) raised at {where}: {what}"


def _where(exc: BaseException) -> str:
    """The file and line ``exc`` was raised at, in the application's code: the innermost
    frame outside the standard library, installed packages and runifold_sync itself (a
    KeyError raised by ``os.environ[...]`` is placed at the line that read it), else the
    innermost frame of all."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    library = {sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    library.add(str(Path(__file__).resolve().parent))
    prefixes = tuple(os.path.join(path, "") for path in library if path)
    for frame in reversed(frames):
        name = frame.filename
        if not name.startswith("<") and not os.path.abspath(name).startswith(prefixes):
            return f"{name}:{frame.lineno}"
    return f"{frames[-1].filename}:{frames[-1].lineno}"
