"""The layers hold: leaf < core < edges < face, proved by imports in fresh interpreters and by ast.

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
import functools
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
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


def loaded_after_imports(modules: tuple[str, ...], root: Path = PACKAGE.parent) -> set[str]:
    """Every module in sys.modules after importing `modules`, one after another, in one fresh
    interpreter started in `root`."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {list(modules)!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=root,
    )
    return set(json.loads(completed.stdout))


def offenders(
    modules: tuple[str, ...], wrong: Callable[[set[str]], list[str]], root: Path = PACKAGE.parent
) -> dict[str, list[str]]:
    """Module -> what `wrong` finds in what importing it loads, for the modules where it finds
    something. sys.modules only grows, so what importing one module loads is part of what
    importing all of them loads: one interpreter for the whole list proves every module clean
    when their union is. Only when the union is not clean does each module get an interpreter
    of its own, so that a failure names the module that brings the wrong import in."""
    if not wrong(loaded_after_imports(modules, root)):
        return {}
    found = {module: wrong(loaded_after_imports((module,), root)) for module in modules}
    return {module: what for module, what in found.items() if what}


@functools.cache
def layer_offenders(check: str) -> dict[str, list[str]]:
    """`offenders` for one of this file's checks over its whole layer, once per test run."""
    modules, wrong = CHECKS[check]
    return offenders(tuple(modules), wrong)


def io_and_edges(loaded: set[str]) -> list[str]:
    """The I/O libraries and the project modules outside the leaf and the core in `loaded`."""
    io = sorted({m.split(".")[0] for m in loaded} & set(FORBIDDEN_IN_CORE))
    project = [m for m in loaded if m.split(".")[0] == "stallwatch"]
    return io + sorted(m for m in project if group_of(m) not in (*LEAF_GROUPS, "core"))


def outside_the_leaf(loaded: set[str]) -> list[str]:
    """The project modules outside the leaf in `loaded`."""
    project = [m for m in loaded if m.split(".")[0] == "stallwatch"]
    return sorted(m for m in project if group_of(m) not in LEAF_GROUPS)


def outside_the_leaf_or_io(loaded: set[str]) -> list[str]:
    """The project modules outside the leaf and the I/O libraries in `loaded`."""
    io = sorted({m.split(".")[0] for m in loaded} & set(FORBIDDEN_IN_CORE))
    return io + outside_the_leaf(loaded)


def restarter_modules(loaded: set[str]) -> list[str]:
    return sorted(m for m in loaded if m.startswith("stallwatch.restarter"))


def exporter_modules(loaded: set[str]) -> list[str]:
    return sorted(m for m in loaded if m.startswith("stallwatch.exporter"))


def modules_of(group: str) -> list[str]:
    return [m for m in project_modules() if group_of(m) == group]


# Check name -> (the modules it imports, what must not be loaded): one interpreter each.
CHECKS: dict[str, tuple[list[str], Callable[[set[str]], list[str]]]] = {
    "core": (modules_of("core"), io_and_edges),
    "leaf": (["stallwatch", *modules_of("common")], outside_the_leaf),
    "engines": (modules_of("engines"), outside_the_leaf_or_io),
    "exporter": (modules_of("exporter"), restarter_modules),
    "restarter": (modules_of("restarter"), exporter_modules),
}


@pytest.mark.parametrize("module", modules_of("core"))
def test_core_module_loads_no_io_library_and_no_edge(module: str) -> None:
    """Importing a core module loads none of the I/O libraries and no edge or face module."""
    found = layer_offenders("core")
    assert module not in found, f"{module} loads {found[module]}"


@pytest.mark.parametrize("module", ["stallwatch", *modules_of("common"), *modules_of("engines")])
def test_leaf_module_loads_nothing_of_the_project_but_the_leaf(module: str) -> None:
    """Importing the leaf loads only `stallwatch`, `stallwatch.engines` and `stallwatch.common`
    of the project, and loads none of the I/O libraries."""
    found = layer_offenders("engines" if group_of(module) == "engines" else "leaf")
    assert module not in found, f"{module} loads {found[module]}"


@pytest.mark.parametrize("module", modules_of("engines"))
def test_engine_profiles_import_only_themselves(module: str) -> None:
    """An engine profile module imports no project module outside `stallwatch.engines`."""
    known = set(project_modules())
    outside = sorted(m for m in imported_modules(module, known) if group_of(m) != "engines")
    assert not outside, f"{module} imports {outside}"


@pytest.mark.parametrize("module", modules_of("exporter"))
def test_exporter_module_loads_no_restarter(module: str) -> None:
    """Importing any exporter module loads no restarter module."""
    found = layer_offenders("exporter")
    assert module not in found, f"{module} loads {found[module]}"


@pytest.mark.parametrize("module", modules_of("restarter"))
def test_restarter_module_loads_no_exporter(module: str) -> None:
    """Importing any restarter module loads no exporter module."""
    found = layer_offenders("restarter")
    assert module not in found, f"{module} loads {found[module]}"


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


def test_one_bad_import_fails_its_layer_and_names_the_module(tmp_path: Path) -> None:
    """In a layer whose other modules are clean, one module importing sqlite3 spoils the union,
    and the check names that module alone, with what it loads."""
    package = tmp_path / "layered"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "clean.py").write_text("import json\n")
    (package / "pure.py").write_text("from layered import clean\n")
    (package / "bad.py").write_text("import sqlite3\n")
    modules = ("layered.clean", "layered.bad", "layered.pure")
    assert offenders(modules, io_and_edges, root=tmp_path) == {"layered.bad": ["sqlite3"]}
    assert offenders(("layered.clean", "layered.pure"), io_and_edges, root=tmp_path) == {}


def test_the_checks_cover_every_module_of_their_layers() -> None:
    """Every core, leaf, exporter and restarter module is imported by one of the layer checks."""
    checked = {module for modules, _ in CHECKS.values() for module in modules}
    layers = ("core", "common", "engines", "exporter", "restarter")
    expected = {"stallwatch", *(m for group in layers for m in modules_of(group))}
    assert expected <= checked
