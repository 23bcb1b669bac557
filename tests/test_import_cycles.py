"""No import cycle in frontier_llm/, module by module (issue 49).

An AST scan of every module's imports, those inside functions included, and a name taken from a
package (``from frontier_llm.logs import X``) counted as an import of its ``__init__``: the
import graph must have no strongly connected component of two modules or more. Imports under
``if TYPE_CHECKING:`` never run and are left out, as .importlinter's
``exclude_type_checking_imports`` leaves them out. .importlinter's ``acyclic_siblings`` contract
says the same of packages; this scan says it of modules, down to the last one.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "frontier_llm"


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:``."""
    out: set[int] = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        if isinstance(node, ast.If) and (
                (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
                or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def _targets(module: str, node: ast.Import | ast.ImportFrom, is_package: bool,
             modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    # A submodule by name, else a name of the module (or of the package's __init__).
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        skipped = _type_checking_nodes(tree)
        deps: set[str] = set()
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom) or id(node) in skipped:
                continue
            for target in _targets(module, node, path.name == "__init__.py", modules):
                while target and target not in modules:  # a name inside a module: the module
                    target = target.rpartition(".")[0]
                if target and target != module:
                    deps.add(target)
        graph[module] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of two modules or more (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_in_the_package():
    assert cycles(import_graph()) == []


def test_the_scan_finds_a_cycle_behind_a_function_level_import(tmp_path):
    """The scan itself: a cycle closed by an import inside a function, or by a name taken from a
    package's __init__, is found; one closed only under TYPE_CHECKING is not a cycle."""
    graph = import_graph()
    graph["frontier_llm.costmodel.gemm"] = {*graph["frontier_llm.costmodel.gemm"],
                                            "frontier_llm.costmodel.moe"}
    assert ["frontier_llm.costmodel.gemm", "frontier_llm.costmodel.moe"] in cycles(graph)
    src = ("def f():\n    from frontier_llm.logs import traces\n"
           "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import frontier_llm.api\n")
    tree = ast.parse(src)
    skipped = _type_checking_nodes(tree)
    kept = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
            and id(n) not in skipped]
    modules = _modules()
    assert sorted(t for n in kept for t in _targets("frontier_llm.x", n, False, modules)) == [
        "frontier_llm.logs.traces", "typing"]
