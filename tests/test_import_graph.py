"""The package's import graph: no cycle, and every import points down the layers.

Every ``import`` statement counts, wherever it is (``TYPE_CHECKING`` blocks and imports
inside functions too): a cycle or an upward import hidden from the interpreter is still
two modules that cannot be read, changed or tested one without the other.

The layers, bottom up (docs/architecture.md draws them): ``errors``; ``model`` (values
every layer shares); ``store``; ``workflow`` (what user code imports: only ``model`` and
``errors`` below it); ``engine`` (the replay of one claim); ``worker`` (one process);
``pool`` (the supervisor); the front door (``app``, ``settings``); ``ops``; ``dashboard``;
then ``cli``, ``contrib`` and ``testing``, which do not import one another. The public
facades at the root (the package itself, ``__main__``, ``sqlite``, ``postgres``,
``outcomes``) may import any layer, and no layer imports them.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "runifold_sync"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules that module ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # ``from . import crashpoints`` imports a module; ``from .x import y`` a name of x.
            submodules = {f"{target}.{alias.name}" for alias in node.names} & known
            found.update(submodules or ({target} & known))
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_type_checking_and_function_level_imports() -> None:
    graph = import_graph()
    commits, compensation = graph["runifold_sync.engine.commits"], graph["runifold_sync.engine.compensation"]
    assert "runifold_sync.model.crashpoints" in commits  # from ..model import crashpoints
    assert "runifold_sync.store.base" in commits  # from ..store.base import ...
    assert "runifold_sync.workflow.declaration" in compensation  # under TYPE_CHECKING
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_module_of_the_package_is_in_an_import_cycle() -> None:
    assert cycles(import_graph()) == []


LAYERS = (
    ("errors",),
    ("model",),
    ("store",),
    ("workflow",),
    ("engine",),
    ("worker",),
    ("pool",),
    ("app",),
    ("ops",),
    ("dashboard",),
    ("cli", "contrib", "testing"),
)
FACADES = {"runifold_sync", "runifold_sync.__main__", "runifold_sync.sqlite", "runifold_sync.postgres"}
FACADES |= {"runifold_sync.outcomes"}
# Only these layers lie below ``workflow``'s code: authoring never reaches the store or engine.
WORKFLOW_MAY_IMPORT = {"errors", "model", "workflow"}


def _part(module: str) -> str:
    """The layer part of a module: ``runifold_sync.store.sqlite.clock`` -> ``store``; the
    front door's two modules (``app`` and its ``settings``) are one part."""
    part = module.split(".")[1]
    return "app" if part == "settings" else part


def _rank(module: str) -> int:
    part = _part(module)
    for rank, parts in enumerate(LAYERS):
        if part in parts:
            return rank
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import that does not point down the layers (or within one part of a layer)."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if target in FACADES:
                if module not in FACADES:
                    found.append(f"{module} -> {target} (a public facade)")
                continue
            if module in FACADES:
                continue
            if _part(module) == _part(target):
                continue
            if _rank(target) >= _rank(module):
                found.append(f"{module} -> {target}")
            elif _part(module) == "workflow" and _part(target) not in WORKFLOW_MAY_IMPORT:
                found.append(f"{module} -> {target} (authoring: model and errors only)")
    return found


def test_every_import_points_down_the_layers() -> None:
    assert upward_imports(import_graph()) == []


def test_the_layer_rule_catches_an_upward_import_a_peer_and_authoring_reaching_down() -> None:
    graph = {
        "runifold_sync.model.values": {"runifold_sync.store.base"},
        "runifold_sync.cli.main": {"runifold_sync.testing.idle"},
        "runifold_sync.workflow.context": {"runifold_sync.store.records", "runifold_sync.model.values"},
        "runifold_sync.engine.calls": {"runifold_sync"},
        "runifold_sync.worker.worker": {"runifold_sync.engine.calls", "runifold_sync.worker.heartbeat"},
    }
    assert upward_imports(graph) == [
        "runifold_sync.cli.main -> runifold_sync.testing.idle",
        "runifold_sync.engine.calls -> runifold_sync (a public facade)",
        "runifold_sync.model.values -> runifold_sync.store.base",
        "runifold_sync.workflow.context -> runifold_sync.store.records (authoring: model and errors only)",
    ]


def test_at_most_twelve_modules_live_directly_in_the_package() -> None:
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top
