"""The package's layout: the parts are folders, imports point one way, no module cycles.

The import graph is read from the source with :mod:`ast` (every ``import`` and
``from ... import``, also inside functions and under ``TYPE_CHECKING``), so a lazy import
cannot hide a cycle. Run ``python -m pytest tests/test_layout.py -q`` to check a change;
``python tests/test_layout.py`` prints the graph's layers and any cycle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = "pymc_minibatch_mh"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

#: The parts from the bottom up: a module may import modules of its own layer or of
#: layers below it, never above. ``errors`` and ``progress`` are leaves (no imports of the
#: package); ``datasets`` stands apart (data for examples and tests).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "progress"),
    ("core",),
    ("store",),
    ("model",),
    ("estimators", "proposals"),
    ("transition",),
    ("step_methods",),
    ("diagnostics", "__init__"),
)
APART = ("datasets",)


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict[str, set[str]]:
    """``{module: {imported modules of the package}}`` (submodule names resolved)."""
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        targets: set[str] = set()
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, node, path.name == "__init__.py")
                # ``from pkg import mod`` imports the submodule when there is one.
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
                         for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name.startswith(PACKAGE + ".") and name != module:
                    targets.add(name)
        graph[module] = targets
    return graph


def part(module: str) -> str:
    """The part (top-level folder or module) a module belongs to."""
    rest = module[len(PACKAGE) + 1 :] if module != PACKAGE else "__init__"
    return rest.split(".")[0]


def layer_of(module: str) -> int | None:
    name = part(module)
    for i, names in enumerate(LAYERS):
        if name in names:
            return i
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def package_face_imports(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph without the package's own ``__init__`` (it only hands names on)."""
    return {m: {t for t in ts if t != PACKAGE} for m, ts in graph.items() if m != PACKAGE}


def test_no_import_cycle() -> None:
    found = cycles(package_face_imports(import_graph()))
    assert not found, f"modules that import each other in a cycle: {found}"


def test_every_module_is_in_a_part() -> None:
    graph = import_graph()
    stray = [m for m in graph if layer_of(m) is None and part(m) not in APART]
    assert not stray, f"modules outside the declared parts (LAYERS): {stray}"


def test_imports_point_down() -> None:
    graph = import_graph()
    upward = []
    for module, targets in graph.items():
        here = layer_of(module)
        for target in targets:
            there = layer_of(target)
            if part(target) in APART and part(module) not in APART and module != PACKAGE:
                upward.append(f"{module} -> {target} (datasets stand apart)")
            elif here is not None and there is not None and there > here:
                upward.append(f"{module} -> {target}")
    assert not upward, "imports from a lower part to a higher one:\n" + "\n".join(upward)


def test_estimators_and_proposals_are_independent() -> None:
    """The two parts of one layer do not import each other: the step joins them."""
    graph = import_graph()
    crossing = [f"{m} -> {t}" for m, ts in graph.items() for t in ts
                if {part(m), part(t)} == {"estimators", "proposals"}]
    assert not crossing, crossing


def test_core_imports_no_pymc() -> None:
    """The core depends on NumPy, SciPy and Numba only."""
    bad = []
    for path in (ROOT / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.name}: {n}" for n in names
                    if n.split(".")[0] in {"pymc", "pytensor", "arviz"}]
    assert not bad, bad


@pytest.mark.parametrize("name", ["pymc_minibatch_mh.errors", "pymc_minibatch_mh.progress"])
def test_leaves_import_nothing_of_the_package(name: str) -> None:
    assert not import_graph()[name]


if __name__ == "__main__":
    g = import_graph()
    for i, names in enumerate(LAYERS):
        mods = sorted(m for m in g if layer_of(m) == i)
        print(f"layer {i} {names}: {len(mods)} modules")
    print("cycles:", cycles(package_face_imports(g)) or "none")
