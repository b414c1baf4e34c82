"""The package's modules import one another without a cycle, and its layers hold (counting imports under
TYPE_CHECKING and inside functions)."""

from __future__ import annotations

import ast
from pathlib import Path

import handles

PACKAGE = Path(handles.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """Every module of this package `path` imports, anywhere in it (a name imported from a package counts
    as the submodule when there is one, else as the package)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module in modules:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
    return found


def test_no_module_of_the_package_takes_part_in_an_import_cycle() -> None:
    graph = _graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 visiting, 2 done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def _graph() -> dict[str, set[str]]:
    files = [p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts]
    modules = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, modules) - {module_name(p)} for p in files}


def _reached_from(graph: dict[str, set[str]], roots: set[str]) -> set[str]:
    reached: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo.extend(graph[module])
    return reached


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == package or module.startswith(f"{package}.") for package in packages)


def test_the_client_reaches_nothing_of_the_store_the_runtime_or_the_server_faces() -> None:
    graph = _graph()
    client = {module for module in graph if _within(module, ("handles.client",))}
    reached = _reached_from(graph, client)
    forbidden = sorted(
        m for m in reached if _within(m, ("handles.store", "handles.runtime", "handles.server"))
    )
    assert not forbidden, f"handles.client reaches {forbidden}"


def test_the_store_and_the_runtime_know_no_face() -> None:
    graph = _graph()
    inner = {module for module in graph if _within(module, ("handles.store", "handles.runtime"))}
    faces = sorted(
        f"{module} -> {target}"
        for module in inner
        for target in graph[module]
        if _within(target, ("handles.server", "handles.client", "handles.console", "handles.cli"))
    )
    assert not faces, f"imports of a face from the store or the runtime: {faces}"


def test_a_job_authors_modules_reach_the_store_only_through_the_runtime() -> None:
    """`handles.jobs` (JobContext, JobSpec) and what it imports reach no module of the store but by way of
    `handles.runtime`, which hands each JobContext its writes (`JobWrites`)."""
    graph = _graph()
    outside_runtime = {
        module: {target for target in targets if not _within(target, ("handles.runtime",))}
        for module, targets in graph.items()
        if not _within(module, ("handles.runtime",))
    }
    reached = _reached_from(outside_runtime, {"handles.jobs"})
    forbidden = sorted(module for module in reached if _within(module, ("handles.store",)))
    assert not forbidden, f"handles.jobs reaches {forbidden} other than through handles.runtime"
