"""The package's shape: imports flow one way, and only cells know cell names.

Imports are read with ``ast`` from every file of ``rnn_functional`` (module-level and
function-level imports alike; relative imports resolved), so a lazy import inside a function
counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "rnn_functional"
PACKAGE = "rnn_functional"

# Layers from the bottom: a module may import its own layer and the layers below it.
LAYERS = {
    "rnn_functional.precision": 0,  # a leaf utility: imports nothing of the package
    "rnn_functional.cells": 1,
    "rnn_functional.backends": 2,
    "rnn_functional.functional": 3,
    "rnn_functional.params": 3,
    "rnn_functional.ensemble": 3,
    "rnn_functional.modules": 4,
    "rnn_functional": 5,  # the public export
}
CELL_NAMES = {"lstm", "gru", "norm_gru", "LSTM", "GRU"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return modules[name].name == "__init__.py"


def _imports(name: str, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports (``from pkg import sub`` names the submodule)."""
    tree = ast.parse(modules[name].read_text())
    base = name if _is_package(name, modules) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                source = ".".join(anchor + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a module, or a name in it
                target = target.rpartition(".")[0]
            if target.startswith(PACKAGE) and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, modules) for name in modules}


def _layer(name: str) -> int:
    owner = max((prefix for prefix in LAYERS if name == prefix or name.startswith(prefix + ".")), key=len)
    return LAYERS[owner]


def test_the_parser_sees_known_imports() -> None:
    """The checks below are only as good as the parser: it must see these edges."""
    graph = _graph()
    assert "rnn_functional.cells.base" in graph["rnn_functional.cells.lstm"]  # from .base import ...
    assert "rnn_functional.backends.pad" in graph["rnn_functional.backends"]  # from . import pad
    assert "rnn_functional.cells" in graph["rnn_functional.backends.scan"]  # from ..cells import ...
    assert "rnn_functional.functional.slices" in graph["rnn_functional.functional._core"]  # from . import slices
    assert "rnn_functional.precision" in graph["rnn_functional.backends.triton"]  # from ...precision import ...


def test_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_every_module_has_a_layer() -> None:
    for name in _modules():
        assert any(name == p or name.startswith(p + ".") for p in LAYERS), f"{name}: add it to LAYERS"


def test_no_layer_imports_a_layer_above_it() -> None:
    bad = [
        f"{src} (layer {_layer(src)}) imports {dst} (layer {_layer(dst)})"
        for src, targets in _graph().items()
        for dst in sorted(targets)
        if _layer(dst) > _layer(src)
    ]
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def _cell_name_compares(path: Path) -> list[str]:
    """``x == "lstm"``, ``kind in ("LSTM", ...)``, ``"gru" != y``: compares against a cell name."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        values = [e for o in operands for e in (o.elts if isinstance(o, (ast.Tuple, ast.List, ast.Set)) else [o])]
        names = [v.value for v in values if isinstance(v, ast.Constant) and v.value in CELL_NAMES]
        if names:
            hits.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: compares against {names}")
    return hits


def test_the_name_check_finds_a_compare(tmp_path: Path) -> None:
    """The check below must catch the spellings it is meant to forbid."""
    source = tmp_path / "rnn_functional" / "x.py"
    source.parent.mkdir()
    source.write_text('a = kind == "lstm"\nb = "GRU" != kind\nc = kind in ("norm_gru", "x")\nd = kind == "other"\n')
    global ROOT
    saved, ROOT = ROOT, tmp_path / "rnn_functional"
    try:
        assert len(_cell_name_compares(source)) == 3
    finally:
        ROOT = saved


AREAS = {
    "backends": lambda rel: rel.parts[0] == "backends",
    "functional": lambda rel: rel.parts[0] == "functional",
    "top-level files": lambda rel: len(rel.parts) == 1,
    "modules": lambda rel: rel.parts[0] == "modules",
}


@pytest.mark.parametrize("area", list(AREAS))
def test_no_cell_name_compares_outside_cells(area: str) -> None:
    files = [p for p in sorted(ROOT.rglob("*.py")) if AREAS[area](p.relative_to(ROOT))]
    assert files
    hits = [hit for p in files for hit in _cell_name_compares(p)]
    assert not hits, "cell names compared outside cells/ (ask the cell instead):\n" + "\n".join(hits)


def test_extras_by_purpose() -> None:
    """The core depends on torch, tensordict and numpy only; ``[test]`` installs every other extra (a list of its
    own, since pip's self-referencing extras need a resolver that finds this project by name)."""
    import re

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=\[]", r)[0] for r in project["dependencies"]}
    assert names == {"torch", "tensordict", "numpy"}
    extras = project["optional-dependencies"]
    assert {"torchrl", "triton", "examples", "docs", "test"} <= set(extras)
    assert set().union(*(v for k, v in extras.items() if k != "test")) <= set(extras["test"])
