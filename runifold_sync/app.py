"""Finding the application's registry from a ``module:attribute`` reference, as the
``run`` and ``versions`` commands and the framework integrations do."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from .definition import WorkflowRegistry
from .errors import InvalidArgument


def load_registry(reference: str) -> WorkflowRegistry:
    """Import ``module:attribute``; the attribute is a registry or a function returning
    one (a function lets the application build it after fork, in each worker)."""
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise InvalidArgument(f"app reference must look like 'package.module:registry', got {reference!r}")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # like `python -m`, find the app in the cwd
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgument(
            f"cannot import {module_name!r} from app reference {reference!r}: {exc}"
        ) from exc
    try:
        target = getattr(module, attribute)
    except AttributeError as exc:
        raise InvalidArgument(f"module {module_name!r} has no attribute {attribute!r}") from exc
    registry = target() if callable(target) and not isinstance(target, WorkflowRegistry) else target
    if not isinstance(registry, WorkflowRegistry):
        raise InvalidArgument(f"{reference!r} is not a WorkflowRegistry (got {type(registry).__name__})")
    return registry
