"""The layers hold: leaf < core < edges < face, proved by imports in a fresh interpreter and by ast.

- the leaf (`stallwatch`, `stallwatch.engines`, `stallwatch.common`) imports nothing of the
  project but the leaf: the engine profiles import only themselves, the config may read them;
- the core (`stallwatch.core`) imports only the leaf and the standard library, and loading it
  loads no aiohttp, asyncio, sqlite3, subprocess or yaml;
- the edges (`stallwatch.net`, `stallwatch.exporter`, `stallwatch.restarter`,
  `stallwatch.simulator`) import the core and the leaf, never the face; the exporter and the
  restarter never import each other, and share `stallwatch.net`;
- the face (`stallwatch.cli`, `demo*`, `replay*`, `localstack*`, `__main__`) sits on top;
- no two subpackages import each other, directly or through others;
- no two modules import each other, directly or through others: the module graph counts every
  import, those under `if TYPE_CHECKING:` and those inside functions included.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "stallwatch"
LEAF, CORE, EDGE, FACE = 0, 1, 2, 3
LEAF_GROUPS = ("stallwatch", "engines", "common")
LAYER_NAMES = {LEAF: "leaf", CORE: "core", EDGE: "edge", FACE: "face"}
EDGES = ("net", "exporter", "restarter", "simulator")
FACE_PREFIXES = ("cli", "demo", "replay", "localstack", "__main__")
FORBIDDEN_IN_CORE = ("aiohttp", "asyncio", "sqlite3", "subprocess", "yaml")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> list[str]:
    return sorted(module_name(path) for path in PACKAGE.rglob("*.py"))


def group_of(module: str) -> str:
    """The node of the layer graph a module belongs to: its subpackage, or a face module."""
    parts = module.split(".")
    return "stallwatch" if len(parts) == 1 else parts[1]


def layer_of(group: str) -> int:
    if group in LEAF_GROUPS:
        return LEAF
    if group == "core":
        return CORE
    if group in EDGES:
        return EDGE
    if group.startswith(FACE_PREFIXES):
        return FACE
    raise AssertionError(f"stallwatch.{group} belongs to no layer: add it to test_layers.py")


def imported_modules(module: str, known: set[str]) -> Iterator[str]:
    """Project modules `module` imports anywhere in its source (functions included)."""
    path = PACKAGE.parent / Path(*module.split("."))
    file = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    yield from imports_in_source(file.read_text(encoding="utf-8"), package, known)


def imports_in_source(source: str, package: str, known: set[str]) -> Iterator[str]:
    """Project modules a source in `package` imports: at the top, under `if TYPE_CHECKING:`
    and inside functions alike (ast.walk visits every statement)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name.split(".")[0] == "stallwatch":
                yield name


def import_graph() -> dict[str, set[str]]:
    """Group -> the groups its modules import (itself left out)."""
    modules = project_modules()
    known = set(modules)
    graph: dict[str, set[str]] = {group_of(m): set() for m in modules}
    for module in modules:
        for imported in imported_modules(module, known):
            if group_of(imported) != group_of(module):
                graph[group_of(module)].add(group_of(imported))
    return graph


def module_import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (itself left out)."""
    modules = project_modules()
    known = set(modules)
    return {m: {i for i in imported_modules(m, known) if i != m} for m in modules}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return [*stack[stack.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def loaded_after_import(module: str) -> set[str]:
    """Every module in sys.modules after importing `module` in a fresh interpreter."""
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=PACKAGE.parent,
    )
    return set(json.loads(completed.stdout))


def modules_of(group: str) -> list[str]:
    return [m for m in project_modules() if group_of(m) == group]


@pytest.mark.parametrize("module", modules_of("core"))
def test_core_module_loads_no_io_library_and_no_edge(module: str) -> None:
    """Importing a core module loads none of the I/O libraries and no edge or face module."""
    loaded = loaded_after_import(module)
    io = sorted({m.split(".")[0] for m in loaded} & set(FORBIDDEN_IN_CORE))
    assert not io, f"{module} loads {io}"
    project = [m for m in loaded if m.split(".")[0] == "stallwatch"]
    outside = sorted(m for m in project if group_of(m) not in (*LEAF_GROUPS, "core"))
    assert not outside, f"{module} loads {outside}"


@pytest.mark.parametrize("module", ["stallwatch", *modules_of("common"), *modules_of("engines")])
def test_leaf_module_loads_nothing_of_the_project_but_the_leaf(module: str) -> None:
    """Importing the leaf loads only `stallwatch`, `stallwatch.engines` and `stallwatch.common`
    of the project, and loads none of the I/O libraries."""
    loaded = loaded_after_import(module)
    project = sorted(m for m in loaded if m.split(".")[0] == "stallwatch")
    assert all(group_of(m) in LEAF_GROUPS for m in project), project
    if group_of(module) == "engines":
        assert not {m.split(".")[0] for m in loaded} & set(FORBIDDEN_IN_CORE)


@pytest.mark.parametrize("module", modules_of("engines"))
def test_engine_profiles_import_only_themselves(module: str) -> None:
    """An engine profile module imports no project module outside `stallwatch.engines`."""
    known = set(project_modules())
    outside = sorted(m for m in imported_modules(module, known) if group_of(m) != "engines")
    assert not outside, f"{module} imports {outside}"


@pytest.mark.parametrize("module", modules_of("exporter"))
def test_exporter_module_loads_no_restarter(module: str) -> None:
    """Importing any exporter module loads no restarter module."""
    loaded = loaded_after_import(module)
    assert not [m for m in loaded if m.startswith("stallwatch.restarter")]


@pytest.mark.parametrize("module", modules_of("restarter"))
def test_restarter_module_loads_no_exporter(module: str) -> None:
    """Importing any restarter module loads no exporter module."""
    loaded = loaded_after_import(module)
    assert not [m for m in loaded if m.startswith("stallwatch.exporter")]


def test_every_import_points_down_or_sideways_without_cycles() -> None:
    """Statically: imports go down or sideways, never exporter -> restarter, and form no cycle."""
    graph = import_graph()
    upward = [
        f"stallwatch.{source} ({LAYER_NAMES[layer_of(source)]}) imports "
        f"stallwatch.{target} ({LAYER_NAMES[layer_of(target)]})"
        for source, targets in sorted(graph.items())
        for target in sorted(targets)
        # The package root is the bottom of the leaf: it imports nothing of the project.
        if source == "stallwatch" or layer_of(target) > layer_of(source)
    ]
    assert not upward, "\n".join(upward)
    assert "restarter" not in graph["exporter"], "the exporter imports the restarter"
    assert "exporter" not in graph["restarter"], "the restarter imports the exporter"
    assert not graph["net"] & {"exporter", "restarter", "simulator"}, graph["net"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_graph_sees_the_imports_it_checks() -> None:
    """The static graph is not empty by mistake: it sees edges known to exist."""
    graph = import_graph()
    assert {"core", "common", "stallwatch"} <= graph["exporter"]
    assert "net" in graph["restarter"]
    assert "net" in graph["exporter"]
    assert "common" in graph["core"]
    assert "engines" in graph["common"]


def test_no_two_modules_import_each_other_directly_or_through_others() -> None:
    """No cycle in the graph of module imports; a failure names the cycle, module by module."""
    cycle = find_cycle(module_import_graph())
    assert cycle is None, "module import cycle: " + " -> ".join(cycle or [])


def test_the_module_graph_counts_type_checking_and_function_level_imports() -> None:
    """Imports under `if TYPE_CHECKING:`, in a function and relative ones are edges, as top ones."""
    known = {"stallwatch", "stallwatch.a", "stallwatch.b", "stallwatch.c", "stallwatch.d"}
    source = (
        "from typing import TYPE_CHECKING\n"
        "import stallwatch.a\n"
        "if TYPE_CHECKING:\n"
        "    from stallwatch.b import Thing\n"
        "def later() -> None:\n"
        "    from stallwatch import c\n"
        "from .d import other\n"
    )
    found = set(imports_in_source(source, "stallwatch", known))
    assert found == known


def test_find_cycle_names_the_cycle_module_by_module() -> None:
    """A three-module cycle is reported as the path around it; a graph without one as None."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
