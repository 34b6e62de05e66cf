"""Static checks over src/debatebus, read with ``ast`` (nothing is imported).

- No module imports an underscore name of another package (a ``_``-prefixed function, class or
  constant). Modules of other packages may be private (``debatebus.transports._base``): inside
  debatebus, packages build on each other's internals; users import only public modules.
- The packages import each other without a cycle, counting every import: at module level, in a
  function (an import put there to hide a cycle is still the cycle) and under
  ``if TYPE_CHECKING:`` (a type is a dependency too: a module that types against a layer above it
  depends on that layer). Each first-level package is one node (``debatebus.transports.kafka``
  belongs to ``debatebus.transports``). The root directory is not a layer: each of its modules is
  a node of its own (``debatebus.exceptions`` is imported by every package, and
  ``debatebus._worker`` imports most of them; the facade ``debatebus/__init__`` is one more node).
- No import inside a function closes a cycle of the imports run at import time (within a
  package too): such an import only hides the cycle.
- The engine imports nothing of debatebus outside ``ENGINE_MAY_IMPORT``: the exceptions, token
  usage, the wire schemas, the LLM interface and prices.
- No function or method is longer than 60 lines.
- Every public module declares an explicit ``__all__`` of names it defines; a private module
  (``_``-prefixed) declares none: ``__all__`` is where the API is.

A "package" is a directory: ``debatebus.engine._run`` belongs to ``debatebus.engine``, and
``debatebus._worker`` to ``debatebus``; a "layer" is a first-level package (or a root module).
Each check lists every violation as ``file:line: what``.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "debatebus"
MAX_FUNCTION_LINES = 60
ENGINE = f"{ROOT}.engine"
#: What the engine may import of debatebus besides itself: modules, or packages (every module in
#: them). Nothing that does I/O or knows a bus (handlers, transports, stores, workers).
ENGINE_MAY_IMPORT = frozenset({
    f"{ROOT}.exceptions",  # the one exception tree
    f"{ROOT}._usage",  # token accounting
    f"{ROOT}.schemas",  # wire values: events, cost, the envelope's names
    f"{ROOT}.llm._base",  # the LLM interface the engine calls
    f"{ROOT}.llm._structured",  # reading a judge's JSON verdict
    f"{ROOT}._pricing",  # what a debate's prices say a call cost
})


@dataclass(frozen=True)
class Module:
    name: str  # dotted: debatebus.engine._run (a package's __init__ is the package's name)
    package: str  # the dotted name of its directory: debatebus.engine
    path: Path  # relative to the source root, for messages
    tree: ast.Module


@dataclass(frozen=True)
class Import:
    importer: Module
    line: int
    source: str  # the module named after ``from`` (or the imported module itself)
    target: str  # the full dotted name imported: source.name for ``from source import name``


def load(src: Path, root: str) -> dict[str, Module]:
    modules = {}
    for path in sorted((src / root).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        package = ".".join(parts[:-1])
        name = package if parts[-1] == "__init__" else ".".join(parts)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        modules[name] = Module(name, package, path.relative_to(src), tree)
    return modules


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _run_at_import(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run when the module is imported (``if TYPE_CHECKING:`` bodies and
    function bodies left out)."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If):
            if not _is_type_checking(stmt.test):
                yield from _run_at_import(stmt.body)
            yield from _run_at_import(stmt.orelse)
        elif isinstance(stmt, ast.Try | ast.TryStar):
            for block in (stmt.body, stmt.orelse, stmt.finalbody):
                yield from _run_at_import(block)
            for handler in stmt.handlers:
                yield from _run_at_import(handler.body)
        elif isinstance(stmt, ast.With | ast.AsyncWith | ast.ClassDef):
            yield from _run_at_import(stmt.body)


def _in_functions(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """The nodes inside the module's functions and methods (run when they are called)."""
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from ast.walk(node)


def _imports_in(module: Module, nodes: Iterator[ast.AST]) -> Iterator[Import]:
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, node.lineno, alias.name, alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            source = node.module or ""
            if node.level:
                base = module.package.split(".")[: len(module.package.split(".")) - node.level + 1]
                source = ".".join([*base, source] if source else base)
            for alias in node.names:
                yield Import(module, node.lineno, source, f"{source}.{alias.name}")


def all_imports(module: Module) -> Iterator[Import]:
    return _imports_in(module, ast.walk(module.tree))


def imports_at_import(module: Module) -> Iterator[Import]:
    return _imports_in(module, _run_at_import(module.tree.body))


def imports_in_functions(module: Module) -> Iterator[Import]:
    return _imports_in(module, _in_functions(module.tree.body))


def resolve(imp: Import, modules: dict[str, Module]) -> Module | None:
    """The package module an import loads (``from pkg import mod`` loads ``pkg.mod``)."""
    return modules.get(imp.target) or modules.get(imp.source)


def private_import_violations(modules: dict[str, Module]) -> list[str]:
    found = []
    for module in modules.values():
        for imp in all_imports(module):
            name = imp.target.rsplit(".", 1)[-1]
            if not _is_private(name) or imp.target in modules:  # a public name, or a module
                continue
            loaded = resolve(imp, modules)
            package = loaded.package if loaded else imp.source.split(".")[0]
            if package != module.package:
                found.append(f"{module.path}:{imp.line}: imports {imp.target} "
                             f"(private {name} of package {package})")
    return found


def import_edges(modules: dict[str, Module]) -> dict[tuple[str, str], list[str]]:
    """(importer, imported) module names → where the imports between them are (every import:
    module level, in functions, under ``if TYPE_CHECKING:``)."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module in modules.values():
        for imp in all_imports(module):
            loaded = resolve(imp, modules)
            if loaded is not None and loaded is not module:
                where = edges.setdefault((module.name, loaded.name), [])
                if f"{module.path}:{imp.line}" not in where:
                    where.append(f"{module.path}:{imp.line}")
    return edges


def components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while (member := stack.pop()) != node:
                component.append(member)
            if component:
                found.append(sorted([*component, node]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def cycle_through(graph: dict[str, set[str]], members: list[str]) -> list[str]:
    """A shortest cycle through the first of ``members`` (one strongly connected component)."""
    start = members[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        node = frontier.pop(0)
        for succ in sorted(graph.get(node, ())):
            if succ == start:
                return [*paths[node], start]
            if succ in members and succ not in paths:
                paths[succ] = [*paths[node], succ]
                frontier.append(succ)
    raise AssertionError(f"{members} is not strongly connected")


def node_of(module: Module) -> str:
    """A module's node in the package graph: its first-level package, or itself for a root-level
    module."""
    if module.package == ROOT:
        return module.name
    return ".".join(module.package.split(".")[:2])


def _within(name: str, allowed: frozenset[str]) -> bool:
    return any(name == a or name.startswith(f"{a}.") for a in allowed)


def engine_import_violations(modules: dict[str, Module], engine: str,
                             allowed: frozenset[str]) -> list[str]:
    """Every import (module level, in functions, for types) by a module of ``engine`` of a
    module of the project outside ``engine`` and ``allowed``."""
    found = []
    for module in modules.values():
        if not _within(module.name, frozenset({engine})):
            continue
        for imp in all_imports(module):
            loaded = resolve(imp, modules)
            if loaded is None or _within(loaded.name, frozenset({engine})):
                continue
            line = f"{module.path}:{imp.line}: the engine imports {loaded.name}"
            if not _within(loaded.name, allowed) and line not in found:
                found.append(line)
    return found


def package_cycle_violations(modules: dict[str, Module]) -> list[str]:
    """Each set of packages that import each other in a circle: one cycle through it, then
    every package-to-package import inside it, with where one such import is."""
    edges: dict[tuple[str, str], list[str]] = {}
    for (importer, imported), where in import_edges(modules).items():
        pair = (node_of(modules[importer]), node_of(modules[imported]))
        if pair[0] != pair[1]:
            edges.setdefault(pair, []).extend(f"{w} ({importer} → {imported})" for w in where)
    graph: dict[str, set[str]] = {}
    for importer, imported in edges:
        graph.setdefault(importer, set()).add(imported)
    found = []
    for members in components(graph):
        found.append(f"packages in a cycle: {', '.join(members)}; "
                     f"e.g. {' → '.join(cycle_through(graph, members))}")
        for (importer, imported), where in sorted(edges.items()):
            if importer in members and imported in members:
                more = f" and {len(where) - 1} more" if len(where) > 1 else ""
                found.append(f"    {importer} → {imported}: {where[0]}{more}")
    return found


def module_cycle_violations(modules: dict[str, Module]) -> list[str]:
    """Each set of modules of more than one package that import each other in a circle."""
    edges = import_edges(modules)
    graph: dict[str, set[str]] = {}
    for importer, imported in edges:
        graph.setdefault(importer, set()).add(imported)
    found = []
    for members in components(graph):
        if len({modules[m].package for m in members}) > 1:
            cycle = cycle_through(graph, members)
            found.append(f"module cycle across packages: {' → '.join(cycle)}")
            found.extend(f"    {', '.join(edges[pair])}" for pair in itertools.pairwise(cycle))
    return found


def hidden_cycle_violations(modules: dict[str, Module]) -> list[str]:
    """Each import inside a function of a module that the imported module reaches back to
    through the imports run at import time: a cycle the function-level import hides (within a
    package too)."""
    runtime: dict[str, set[str]] = {}
    for module in modules.values():
        for imp in imports_at_import(module):
            loaded = resolve(imp, modules)
            if loaded is not None and loaded is not module:
                runtime.setdefault(module.name, set()).add(loaded.name)

    def reaches(start: str, goal: str) -> bool:
        seen, stack = {start}, [start]
        while stack:
            for succ in runtime.get(stack.pop(), ()):
                if succ == goal:
                    return True
                if succ not in seen:
                    seen.add(succ)
                    stack.append(succ)
        return False

    found = []
    for module in modules.values():
        for imp in imports_in_functions(module):
            loaded = resolve(imp, modules)
            if loaded is not None and loaded is not module and reaches(loaded.name, module.name):
                line = (f"{module.path}:{imp.line}: imports {loaded.name} in a function, which "
                        f"imports {module.name} back")
                if line not in found:
                    found.append(line)
    return found


def long_function_violations(modules: dict[str, Module], limit: int) -> list[str]:
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    length = (child.end_lineno or child.lineno) - child.lineno + 1
                    if length > limit:
                        found.append(f"{module.path}:{child.lineno}: {name} is {length} lines")
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    for module in modules.values():
        visit(module.tree, "")
    return found


def _bound_names(body: list[ast.stmt]) -> set[str]:
    """Names a module binds at its top level (``if``/``try`` branches and TYPE_CHECKING too)."""
    names: set[str] = set()
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in stmt.names)
        elif isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(stmt, ast.If | ast.Try | ast.TryStar):
            blocks = [stmt.body, stmt.orelse, *([stmt.finalbody] if hasattr(stmt, "finalbody")
                                                else [])]
            blocks += [h.body for h in getattr(stmt, "handlers", [])]
            for block in blocks:
                names |= _bound_names(block)
    return names


def _declared_all(tree: ast.Module) -> tuple[int, list[str] | None] | None:
    """(line, names) of the module's ``__all__``; names is None unless a literal of strings."""
    for stmt in tree.body:
        value: ast.expr | None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign):
            target, value = stmt.target, stmt.value
        else:
            continue
        if not (isinstance(target, ast.Name) and target.id == "__all__"):
            continue
        if isinstance(value, ast.List | ast.Tuple):
            names = [e.value for e in value.elts
                     if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len(names) == len(value.elts):
                return stmt.lineno, names
        return stmt.lineno, None
    return None


def missing_all_violations(modules: dict[str, Module]) -> list[str]:
    found = []
    for module in modules.values():
        declared = _declared_all(module.tree)
        if any(_is_private(part) for part in module.name.split(".")):  # _x.py, _pkg/…
            # A private package's __init__ may list what its modules give the rest of debatebus.
            if declared is not None and module.name != module.package:
                found.append(f"{module.path}:{declared[0]}: private module declares __all__ "
                             "(its names are not an API: drop it, or make the module public)")
            continue
        if module.name.endswith("__main__"):
            continue
        if declared is None:
            found.append(f"{module.path}:1: public module without __all__")
            continue
        line, names = declared
        if names is None:
            found.append(f"{module.path}:{line}: __all__ is not a literal list of names")
            continue
        bound = _bound_names(module.tree.body)
        found.extend(f"{module.path}:{line}: __all__ lists {name!r}, which the module does not "
                     f"define" for name in names if name not in bound)
    return found


MODULES = load(SRC, ROOT)


def _report(found: list[str]) -> str:
    return f"{len(found)} violation(s):\n" + "\n".join(found)


def test_the_package_is_found() -> None:
    assert f"{ROOT}._worker" in MODULES
    assert MODULES[f"{ROOT}.engine._run"].package == f"{ROOT}.engine"


def test_no_module_imports_a_private_name_of_another_package() -> None:
    found = private_import_violations(MODULES)
    assert not found, _report(found)


def test_packages_import_each_other_without_a_cycle() -> None:
    found = package_cycle_violations(MODULES)
    assert not found, _report(found)


def test_the_engine_imports_nothing_above_it() -> None:
    found = engine_import_violations(MODULES, ENGINE, ENGINE_MAY_IMPORT)
    assert not found, _report(found)


def test_no_import_cycle_crosses_a_package_boundary() -> None:
    found = module_cycle_violations(MODULES)
    assert not found, _report(found)


def test_no_function_level_import_hides_a_cycle() -> None:
    found = hidden_cycle_violations(MODULES)
    assert not found, _report(found)


def test_no_function_is_longer_than_the_limit() -> None:
    found = long_function_violations(MODULES, MAX_FUNCTION_LINES)
    assert not found, _report(found)


def test_every_public_module_declares_all() -> None:
    found = missing_all_violations(MODULES)
    assert not found, _report(found)


# The checks themselves, on a small tree written for each case: each one can fail.


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    files = {
        "pkg/__init__.py": "__all__ = ['VALUE']\nfrom pkg.a.x import VALUE\n",
        "pkg/a/__init__.py": "__all__: list[str] = []\n",
        "pkg/a/_impl.py": "_secret = 1\n",
        "pkg/a/x.py": "from pkg.a._impl import _secret\n__all__ = ['VALUE']\nVALUE = _secret\n",
        "pkg/b/__init__.py": "__all__ = []\n",
        "pkg/b/y.py": ("from typing import TYPE_CHECKING\nfrom pkg.a._impl import _secret\n"
                       "if TYPE_CHECKING:\n    from pkg.c import z\n__all__ = ['f', 'gone']\n"
                       "def f():\n    from pkg.c import z\n" + "    z\n" * 59),
        "pkg/c/__init__.py": "__all__ = []\n",
        "pkg/c/z.py": "from ..b.y import f\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_private_imports_are_caught_across_packages_only(tree: Path) -> None:
    found = private_import_violations(load(tree, "pkg"))
    assert found == ["pkg/b/y.py:2: imports pkg.a._impl._secret (private _secret of package pkg.a)"]
    # pkg/a/x.py imports _secret from pkg.a._impl: the same package, so not a violation


def test_cycles_are_caught_through_function_and_type_checking_imports(tree: Path) -> None:
    # pkg.b.y imports pkg.c.z only under TYPE_CHECKING and in a function; pkg.c.z imports pkg.b.y
    assert package_cycle_violations(load(tree, "pkg")) == [
        "packages in a cycle: pkg.b, pkg.c; e.g. pkg.b → pkg.c → pkg.b",
        "    pkg.b → pkg.c: pkg/b/y.py:4 (pkg.b.y → pkg.c.z) and 1 more",
        "    pkg.c → pkg.b: pkg/c/z.py:1 (pkg.c.z → pkg.b.y)",
    ]
    (tree / "pkg/c/z.py").write_text("X = 1\n")
    assert package_cycle_violations(load(tree, "pkg")) == []
    (tree / "pkg/a/x.py").write_text("from pkg.b.y import f\n__all__ = ['VALUE']\nVALUE = 1\n")
    modules = load(tree, "pkg")
    assert package_cycle_violations(modules) == [
        "packages in a cycle: pkg.a, pkg.b; e.g. pkg.a → pkg.b → pkg.a",
        "    pkg.a → pkg.b: pkg/a/x.py:1 (pkg.a.x → pkg.b.y)",
        "    pkg.b → pkg.a: pkg/b/y.py:2 (pkg.b.y → pkg.a._impl)",
    ]
    assert module_cycle_violations(modules) == []  # the packages' cycle, not the modules'
    (tree / "pkg/a/_impl.py").write_text("def g():\n    from pkg.b import y\n")
    assert module_cycle_violations(load(tree, "pkg")) == [
        "module cycle across packages: pkg.a._impl → pkg.b.y → pkg.a._impl",
        "    pkg/a/_impl.py:2",
        "    pkg/b/y.py:2",
    ]


def test_a_cycle_hidden_in_a_function_is_caught_within_a_package_too(tree: Path) -> None:
    assert hidden_cycle_violations(load(tree, "pkg")) == [
        "pkg/b/y.py:7: imports pkg.c.z in a function, which imports pkg.b.y back"]
    (tree / "pkg/c/z.py").write_text("X = 1\n")
    assert hidden_cycle_violations(load(tree, "pkg")) == []
    (tree / "pkg/a/w.py").write_text("from pkg.a.x import VALUE\n")
    (tree / "pkg/a/x.py").write_text("def f():\n    from pkg.a import w\n")
    assert hidden_cycle_violations(load(tree, "pkg")) == [
        "pkg/a/x.py:2: imports pkg.a.w in a function, which imports pkg.a.x back"]


def test_a_subpackage_is_part_of_its_first_level_package(tree: Path) -> None:
    (tree / "pkg/c/z.py").write_text("X = 1\n")
    (tree / "pkg/a/deep").mkdir()
    (tree / "pkg/a/deep/__init__.py").write_text("from pkg.a.x import VALUE\n")
    (tree / "pkg/a/x.py").write_text("def f():\n    from pkg.a.deep import VALUE\n")
    assert package_cycle_violations(load(tree, "pkg")) == []


def test_the_engine_check_catches_every_kind_of_import(tree: Path) -> None:
    (tree / "pkg/a/y.py").write_text(
        "from typing import TYPE_CHECKING\nfrom pkg.c import z\nif TYPE_CHECKING:\n"
        "    from pkg.b.y import f\ndef g():\n    import pkg.b.y\n")
    modules = load(tree, "pkg")
    assert engine_import_violations(modules, "pkg.a", frozenset({"pkg.c"})) == [
        "pkg/a/y.py:4: the engine imports pkg.b.y",
        "pkg/a/y.py:6: the engine imports pkg.b.y",
    ]
    assert engine_import_violations(modules, "pkg.a", frozenset({"pkg.b.y", "pkg.c.z"})) == []


def test_long_functions_are_caught(tree: Path) -> None:
    modules = load(tree, "pkg")
    assert long_function_violations(modules, 61) == []
    assert long_function_violations(modules, 60) == ["pkg/b/y.py:6: f is 61 lines"]


def test_missing_or_wrong_all_is_caught(tree: Path) -> None:
    (tree / "pkg/c/z.py").write_text("X = 1\n")
    (tree / "pkg/a/_impl.py").write_text("__all__ = ['_secret']\n_secret = 1\n")
    assert missing_all_violations(load(tree, "pkg")) == [
        "pkg/a/_impl.py:1: private module declares __all__ (its names are not an API: drop it, "
        "or make the module public)",
        "pkg/b/y.py:5: __all__ lists 'gone', which the module does not define",
        "pkg/c/z.py:1: public module without __all__",
    ]
