"""Replaying an exported production run against the code under test: the deploy gate of
``versions --replay`` for one run, as a regression test."""

from __future__ import annotations

import json
import os
from typing import Any

from ..engine.dry_replay import dry_replay
from ..errors import InvalidArgument, NonDeterminism
from ..model import validate
from ..ops.run_export import read_export
from ..workflow.registry import WorkflowRegistry


def replay(history: Any, registry: WorkflowRegistry) -> None:
    """Replay the run ``history`` (what ``show TASK --export`` printed: its decoded JSON,
    its text, or the path of a file holding it) against ``registry``'s definition of its
    version, running no step body or effect. Returns None when the code would continue
    the run as recorded; raises :class:`~runifold_sync.errors.NonDeterminism` naming the
    position, the call recorded there and the call the code makes instead.
    :class:`~runifold_sync.errors.UnknownDefinition` when the registry lacks the
    version."""
    validate.instance("registry", registry, WorkflowRegistry)
    data = _loaded(history)
    run = read_export(data)
    definition = registry.get(run.definition, run.version)
    if definition is None:
        registry.task(run.definition, run.version, None)  # raises UnknownDefinition naming what is registered
        raise AssertionError("unreachable")
    if run.checkpoint is None:
        return  # never claimed: any code starts it
    divergence = dry_replay(definition, run.task_id, run.input_json, run.checkpoint)
    if divergence is not None:
        raise NonDeterminism(run.task_id, divergence.position, divergence.recorded, divergence.new)


def _loaded(history: Any) -> Any:
    if isinstance(history, dict):
        return history
    if isinstance(history, os.PathLike):
        with open(history, encoding="utf-8") as file:
            return json.load(file)
    if isinstance(history, str):
        text = history
        if not text.lstrip().startswith("{"):
            with open(text, encoding="utf-8") as file:
                return json.load(file)
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"replay history is not JSON: {exc}") from exc
    validate.refuse("replay history", "an export (dict), its JSON text or a file path", history)
