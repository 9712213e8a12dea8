"""Examples and documentation import only what the package offers its users.

Public: the names in ``pymc_minibatch_mh.__all__`` and the parts a user builds on
(:data:`PUBLIC_PARTS`). The rest (``model``, ``store``, ``estimators``, ``transition``,
``step_methods``, ``progress``) is the package's inside: it changes without notice, and
what a user needs of it is exported at the top level (e.g. ``posterior``, ``sample_stats``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import pymc_minibatch_mh

ROOT = Path(__file__).resolve().parents[1]

#: Sub-packages and modules a user imports from: the NumPy-only acceptance tests, the data
#: sets, the proposals (to write one's own), the exceptions and the audit's diagnostics.
PUBLIC_PARTS = {"core", "datasets", "proposals", "errors", "diagnostics"}

PYTHON = sorted([*ROOT.glob("examples/*.py"), *ROOT.glob("docs/gallery/*.py")])
PAGES = sorted(p for p in [ROOT / "README.md", *ROOT.glob("docs/**/*.md"),
                           *ROOT.glob("docs/**/*.rst")]
               # not the pages a documentation build generates (gitignored)
               if not {"_build", "generated", "auto_examples"} & set(p.parts) and p.exists())

_FROM = re.compile(r"^[ \t>]*from[ \t]+(pymc_minibatch_mh[\w.]*)[ \t]+import[ \t]+"
                   r"(\([^)]*\)|[^\n]*)", re.MULTILINE)
_IMPORT = re.compile(r"^[ \t>]*import[ \t]+(pymc_minibatch_mh[\w.]*)", re.MULTILINE)


def private_import(module: str, names: list[str]) -> str | None:
    """Why ``from module import names`` (or ``import module``) reaches inside; else None."""
    parts = module.split(".")
    if any(p.startswith("_") for p in parts) or any(n.startswith("_") for n in names):
        return "a private name"
    if len(parts) == 1:
        hidden = sorted(set(names) - set(pymc_minibatch_mh.__all__) - {"*"})
        return f"{hidden} not in pymc_minibatch_mh.__all__" if hidden else None
    if parts[1] not in PUBLIC_PARTS:
        return f"pymc_minibatch_mh.{parts[1]} is internal"
    return None


def python_imports(path: Path) -> list[tuple[str, list[str]]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
    return [(m, n) for m, n in out if m.split(".")[0] == "pymc_minibatch_mh"]


def page_imports(path: Path) -> list[tuple[str, list[str]]]:
    text = path.read_text(encoding="utf-8")
    out = [(m, [n.split(" as ")[0].strip() for n in re.split(r"[,\s()]+", names.split("#")[0])
                if n.strip() and n.strip() != "as"])
           for m, names in _FROM.findall(text)]
    return out + [(m, []) for m in _IMPORT.findall(text)]


@pytest.mark.parametrize("path", PYTHON + PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_and_docs_import_no_internal_module(path):
    found = python_imports(path) if path.suffix == ".py" else page_imports(path)
    bad = {f"{m} import {n}": why for m, n in found if (why := private_import(m, n))}
    assert not bad, f"{path.relative_to(ROOT)} reaches inside the package: {bad}"


def test_the_rule_finds_what_it_should(tmp_path):
    assert private_import("pymc_minibatch_mh.model.compat", ["posterior"])
    assert private_import("pymc_minibatch_mh", ["_log"])
    assert private_import("pymc_minibatch_mh", ["RowStore"])
    assert private_import("pymc_minibatch_mh", ["posterior", "MinibatchBarker"]) is None
    assert private_import("pymc_minibatch_mh.core.barker", ["BarkerTest"]) is None
    text = "```python\nfrom pymc_minibatch_mh.model.compat import (\n    posterior,\n)\n```\n"
    page = tmp_path / "page.md"
    page.write_text(text, encoding="utf-8")
    assert page_imports(page) == [("pymc_minibatch_mh.model.compat", ["posterior"])]
