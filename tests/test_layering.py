"""Layers import one way: proto <- workers <- router <- cluster <- bench (DESIGN.md, "Layers").

Every import in the five folders, at module level or inside a function (under ``if TYPE_CHECKING:``
too: a module that needs another's type to be read is tied to it), relative or absolute, is checked:
one that reaches a layer above its own fails the test with its file and line. Nothing imports
bench/: the CLI finds its command by registration (an entry point). Inside a folder no modules
import each other in a circle, and bench/ and cluster/ use no private (underscore) name of another
module. tests/ may import anything.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("proto", "workers", "router", "cluster", "bench")  # each may import only those before it
PACKAGE = "specserve"
NO_PRIVATE_IMPORTS = ("bench", "cluster")  # folders whose modules use only other modules' public names


def module_of(path: Path) -> str:
    """The absolute module name of a file under ROOT (a package's ``__init__.py``: the package)."""
    parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    """Whether ``name`` is a module or package of ours in the tree under ROOT."""
    parts = name.split(".")
    if parts[0] != PACKAGE or len(parts) < 2:
        return False
    where = ROOT.joinpath(*parts[1:])
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


class Import(NamedTuple):
    line: int
    module: str  # absolute, relative imports resolved
    name: str | None  # the name taken from the module; None: the module itself
    bound: str  # the local name the import binds: for `import a.b` without `as`, a (bound to module a)


def imports(path: Path) -> list[Import]:
    """Every import in ``path``, at any depth; ``from P import x`` is read as the module P.x where x
    is a module of ours rather than a name defined in P."""
    package = module_of(path).split(".")[: None if path.name == "__init__.py" else -1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                found.append(Import(node.lineno, alias.name, None, bound))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                bound = alias.asname or alias.name
                # `from specserve import router` imports the layer by its alias name.
                if module == PACKAGE or is_module(f"{module}.{alias.name}"):
                    found.append(Import(node.lineno, f"{module}.{alias.name}", None, bound))
                else:
                    found.append(Import(node.lineno, module, alias.name, bound))
    return found


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, once per line and module."""
    return list(dict.fromkeys((i.line, i.module) for i in imports(path)))


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


def import_graph(folder: str) -> dict[str, dict[str, int]]:
    """Each module of ``folder`` (its subfolders included) -> {module of the folder it imports: line}."""
    paths = {module_of(path): path for path in sorted((ROOT / folder).rglob("*.py"))}
    graph: dict[str, dict[str, int]] = {}
    for module, path in paths.items():
        graph[module] = {}
        for i in imports(path):
            if i.module in paths and i.module != module:
                graph[module].setdefault(i.module, i.line)
    return graph


def import_circles(folder: str) -> list[str]:
    """Each group of modules of ``folder`` that import each other in a circle (a strongly connected
    component of the import graph), with one circle through it and the lines that close it."""
    graph = import_graph(folder)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm; a folder has a few dozen modules
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return [_describe(graph, group, folder) for group in sorted(groups)]


def _describe(graph: dict[str, dict[str, int]], group: list[str], folder: str) -> str:
    """The group's modules, and the shortest circle from its first one back to it, line by line."""
    start, members = group[0], set(group)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        if start in graph[module]:
            break
        for imported in graph[module]:
            if imported in members and imported not in came_from:
                came_from[imported] = module
                queue.append(imported)
    path = [module]
    while path[-1] != start:
        path.append(came_from[path[-1]])
    path.reverse()
    prefix = f"{PACKAGE}.{folder}."
    short = lambda name: name.removeprefix(prefix)  # noqa: E731
    steps = ", ".join(f"{short(a)} imports {short(b)} (line {graph[a][b]})"
                      for a, b in zip(path, path[1:] + [start]))
    return f"{folder}/: {', '.join(map(short, group))} import each other: {steps}"


def private_imports(folders: tuple[str, ...] = NO_PRIVATE_IMPORTS) -> list[str]:
    """Every use of another module's private name in ``folders``: ``from M import _name``, or
    ``M._name`` where M is a module of ours imported by name (dunders are not private)."""
    problems = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            where = path.relative_to(ROOT)
            found = imports(path)
            problems += [f"{where}:{i.line}: imports {i.name} from {i.module}" for i in found
                         if i.name is not None and _private(i.name) and i.module.split(".")[0] == PACKAGE]
            # local name -> the module it is (`import a.b` binds a, to module a)
            modules = {i.bound: i.bound if i.bound == i.module.split(".")[0] else i.module
                       for i in found if i.name is None}
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Attribute) and _private(node.attr):
                    head, _, rest = (_dotted(node.value) or "").partition(".")
                    module = ".".join(filter(None, [modules.get(head), rest]))
                    if head in modules and is_module(module):
                        problems.append(f"{where}:{node.lineno}: uses {node.attr} of {module}")
    return problems


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` of a chain of attributes of a name; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        owner = _dotted(node.value)
        return f"{owner}.{node.attr}" if owner else None
    return None


def test_layers_import_one_way():
    problems = backward_imports()
    assert not problems, "imports against proto <- workers <- router <- cluster <- bench:\n" + "\n".join(problems)


@pytest.mark.parametrize("folder", [
    pytest.param(folder)
    if folder == "router" else folder
    for folder in LAYERS
])
def test_no_import_circle_inside_a_folder(folder):
    """STYLE.md, habit 10: a module that needs another's type to be read is tied to it."""
    circles = import_circles(folder)
    assert not circles, "modules that import each other:\n" + "\n".join(circles)


TRAINING = "cluster.zoo"  # the zoo and training: a layer of its own between workers and cluster


def test_serving_imports_nothing_of_training_and_training_only_what_serves():
    """Building and training models (the zoo, distillation, heads' training) is a layer of its own:
    it imports proto and workers only; workers and router cannot import it (test_layers_import_one_way),
    cluster's commands and bench do. The top level keeps the design card's folders, so it lives in
    cluster/zoo/."""
    problems = []
    for path in sorted((ROOT / "cluster" / "zoo").rglob("*.py")):
        for line, module in imported_modules(path):
            layer = layer_of(module)
            inside = module.startswith(f"{PACKAGE}.{TRAINING}")
            if layer is not None and layer not in ("proto", "workers") and not inside:
                problems.append(f"{path.relative_to(ROOT)}:{line}: imports {module}")
    assert not problems, "the training layer's imports:\n" + "\n".join(problems)


def test_bench_and_cluster_use_no_private_name_of_another_module():
    problems = private_imports()
    assert not problems, "private names used from another module (make them public where they belong):\n" + \
        "\n".join(problems)


@pytest.mark.parametrize("source,expected", [
    ("from specserve.cluster.config import ServiceConfig\n", ["specserve.cluster.config"]),
    ("def f():\n    import specserve.router.policy\n", ["specserve.router.policy"]),
    ("from ...router import policy\n", ["specserve.router"]),
    ("from specserve import cluster\n", ["specserve.cluster"]),
    ("from specserve.bench.run import run_bench\n", ["specserve.bench.run"]),
])
def test_the_checker_sees_every_kind_of_import(tmp_path, monkeypatch, source, expected):
    """Module-level, function-level, relative and package-alias imports are all found (a checker
    that missed one kind would pass whatever the code did)."""
    folder = tmp_path / "workers" / "zoo"
    folder.mkdir(parents=True)
    (folder / "m.py").write_text(source)
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert [name for _, name in imported_modules(folder / "m.py")] == expected
    assert len(backward_imports()) == (1 if layer_of(expected[0]) in ("router", "cluster", "bench") else 0)


@pytest.mark.parametrize("b_source,circle", [
    ("def f():\n    from .a import A\n", True),  # inside a function
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from specserve.workers.a import A\n", True),
    ("from . import a\n", True),  # the module by name, relatively
    ("from specserve.workers.zoo import c\n", False),  # another module, no way back
])
def test_the_checker_sees_a_circle(tmp_path, monkeypatch, b_source, circle):
    """Every kind of import ties two modules, a type-checking one too; a module that imports one
    that does not import it back closes no circle."""
    (tmp_path / "workers" / "zoo").mkdir(parents=True)
    (tmp_path / "workers" / "__init__.py").write_text("")
    (tmp_path / "workers" / "a.py").write_text("from .b import B\nA = 1\n")
    (tmp_path / "workers" / "b.py").write_text(b_source + "B = 2\n")
    (tmp_path / "workers" / "zoo" / "c.py").write_text("C = 3\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    found = import_circles("workers")
    assert found == (["workers/: a, b import each other: a imports b (line 1), b imports a (line "
                      f"{b_source.count(chr(10))})"] if circle else [])


@pytest.mark.parametrize("source,problem", [
    ("from specserve.cluster.cli import _ints\n", "imports _ints from specserve.cluster.cli"),
    ("from .cli import dotted_overrides, _ints\n", "imports _ints from specserve.bench.cli"),
    ("from specserve.cluster import cli\ncli._ints('1')\n", "uses _ints of specserve.cluster.cli"),
    ("import specserve.cluster.cli as c\nc._ints('1')\n", "uses _ints of specserve.cluster.cli"),
    ("import specserve.cluster.cli\nspecserve.cluster.cli._ints('1')\n", "uses _ints of specserve.cluster.cli"),
    ("from specserve.cluster.cli import main, __doc__\nmain.__doc__\n", None),
    ("import argparse\nargparse._SubParsersAction\n", None),  # not one of ours
])
def test_the_checker_sees_private_names(tmp_path, monkeypatch, source, problem):
    for folder, name in (("cluster", "cli.py"), ("bench", "cli.py"), ("bench", "m.py")):
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / name).write_text(source if name == "m.py" else "")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert [p.split(": ", 1)[1] for p in private_imports()] == ([problem] if problem else [])
