"""The layers import one way, and no module imports itself back through others.

rag_core <- runtime <- tasks.adapters <- tasks <- flows <- cli: a module may import its own layer and the
layers below it, never one above. Every import counts, also those inside functions and under
``TYPE_CHECKING``: a lazy import is still a dependency, and a circle through one is still a circle.
The framework-free library is checked apart, on the modules really loaded
(tests/test_prefect_yaml.py::test_rag_core_never_imports_the_frameworks).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Lowest first. tasks.adapters is matched before tasks: the longest prefix decides a module's layer.
LAYERS = ("rag_core", "runtime", "tasks.adapters", "tasks", "flows", "cli")
PACKAGES = ("rag_core", "runtime", "tasks", "flows", "cli")


def layer_of(module: str) -> int | None:
    """The rank of ``module``'s layer (0 = rag_core), or None for a module of no layer (a third-party one)."""
    best = None
    for rank, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(LAYERS[best]):
                best = rank
    return best


def project_modules(root: Path) -> dict[str, Path]:
    """Every module of the layered packages under ``root``, by dotted name (a package by its own name)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def imports_of(module: str, path: Path, known: set[str]) -> Iterator[tuple[str, int]]:
    """``(imported module, line)`` for every import in the file, at any depth; ``from p import m`` names the
    module ``p.m`` when there is one, else ``p``."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield (sub if sub in known else target), node.lineno


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """``{module: {imported project module: first line}}`` over the layered packages."""
    modules = project_modules(root)
    known = set(modules)
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, {})
        for target, line in imports_of(module, path, known):
            while target and target not in known and "." in target:
                target = target.rsplit(".", 1)[0]  # `import a.b.c` of a name inside a.b: the module a.b
            if target in known and target != module:
                edges.setdefault(target, line)
    return graph


def upward_imports(root: Path) -> list[str]:
    """One line per import from a lower layer to a higher one."""
    found = []
    for module, edges in sorted(import_graph(root).items()):
        for target, line in sorted(edges.items()):
            low, high = layer_of(module), layer_of(target)
            if low is not None and high is not None and high > low:
                found.append(f"{module} (line {line}) imports {target}: {LAYERS[low]} may import only "
                             f"{', '.join(LAYERS[:low + 1])}, never {LAYERS[high]}")
    return found


def import_cycles(root: Path) -> list[list[str]]:
    """One cycle ``[a, b, ..., a]`` per strongly connected group of modules (Tarjan's algorithm)."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(graph, group) for group in groups]


def _cycle_in(graph: dict[str, dict[str, int]], group: set[str]) -> list[str]:
    """A path that leaves the group's first module and comes back to it, through members of the group only."""
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for target in sorted(graph[node]):
            if target == start:
                return paths[node] + [start]
            if target in group and target not in paths:
                paths[target] = paths[node] + [target]
                queue.append(target)
    raise AssertionError(f"no cycle through {start} in {sorted(group)}")


def test_every_import_points_down_the_layers() -> None:
    assert len(project_modules(ROOT)) > 100  # the walk really found the tree
    found = upward_imports(ROOT)
    assert not found, "imports that run back up the layers:\n" + "\n".join(found)


def test_no_module_imports_itself_back_through_others() -> None:
    cycles = import_cycles(ROOT)
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_checks_find_an_upward_import_inside_a_function_and_a_circle(tmp_path: Path) -> None:
    tree = _write(tmp_path, {
        "rag_core/__init__.py": "",
        "rag_core/a.py": "from rag_core import b\n",
        "rag_core/b.py": "def f():\n    from . import c\n",
        "rag_core/c.py": "import rag_core.a\n",
        "runtime/__init__.py": "",
        "runtime/settings.py": "import os\n\ndef g():\n    import flows\n",
        "tasks/__init__.py": "",
        "tasks/adapters/__init__.py": "",
        "tasks/adapters/x.py": "from tasks.index import t\n",
        "tasks/index.py": "from tasks.adapters.x import y\nfrom runtime.settings import Settings\n",
        "flows/__init__.py": "",
        "cli/__init__.py": "",
    })
    assert upward_imports(tree) == [
        "runtime.settings (line 4) imports flows: runtime may import only rag_core, runtime, never flows",
        "tasks.adapters.x (line 1) imports tasks.index: tasks.adapters may import only rag_core, runtime, "
        "tasks.adapters, never tasks",
    ]
    assert sorted(import_cycles(tree)) == [["rag_core.a", "rag_core.b", "rag_core.c", "rag_core.a"],
                                           ["tasks.adapters.x", "tasks.index", "tasks.adapters.x"]]
