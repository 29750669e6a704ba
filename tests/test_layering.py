"""Layers import one way: proto <- workers <- router <- cluster (DESIGN.md, "Layers").

Every import in the four folders, at module level or inside a function, relative or absolute, is
checked: one that reaches a layer above its own fails the test with its file and line. bench/ and
tests/ may import anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("proto", "workers", "router", "cluster")  # each may import only those before it
PACKAGE = "specserve"


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``; relative ones resolved."""
    package = [PACKAGE, *path.parent.relative_to(ROOT).parts]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from specserve import router` imports the layer by its alias name.
            names = [f"{module}.{alias.name}" for alias in node.names] if module == PACKAGE else [module]
            found += [(node.lineno, name) for name in names]
    return found


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == PACKAGE and parts[1] in LAYERS else None


def backward_imports() -> list[str]:
    problems = []
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            for line, module in imported_modules(path):
                target = layer_of(module)
                if target is not None and LAYERS.index(target) > LAYERS.index(layer):
                    problems.append(f"{path.relative_to(ROOT)}:{line}: {layer} imports {module} (a layer above)")
    return problems


def test_layers_import_one_way():
    problems = backward_imports()
    assert not problems, "imports against proto <- workers <- router <- cluster:\n" + "\n".join(problems)


@pytest.mark.parametrize("source,expected", [
    ("from specserve.cluster.config import ServiceConfig\n", ["specserve.cluster.config"]),
    ("def f():\n    import specserve.router.policy\n", ["specserve.router.policy"]),
    ("from ...router import policy\n", ["specserve.router"]),
    ("from specserve import cluster\n", ["specserve.cluster"]),
])
def test_the_checker_sees_every_kind_of_import(tmp_path, monkeypatch, source, expected):
    """Module-level, function-level, relative and package-alias imports are all found (a checker
    that missed one kind would pass whatever the code did)."""
    folder = tmp_path / "workers" / "zoo"
    folder.mkdir(parents=True)
    (folder / "m.py").write_text(source)
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert [name for _, name in imported_modules(folder / "m.py")] == expected
    assert len(backward_imports()) == (1 if layer_of(expected[0]) in ("router", "cluster") else 0)
