"""The source's import graph, read with ``ast`` (nothing is imported): module boundaries hold."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "sparkdp").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path) -> list[tuple[str, str]]:
    """(module imported from, name imported) for every ``from ... import`` of sparkdp code."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("sparkdp"):
                found += [(target, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names if alias.name.startswith("sparkdp")]
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> the sparkdp modules it imports (at module level or inside functions)."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        targets = set()
        for target, imported in _imports(name, path):
            sub = f"{target}.{imported}"
            targets.add(sub if sub in modules else target)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_another_modules_private_names():
    modules = _modules()
    offenders = [
        f"{name} imports {target}.{imported}"
        for name, path in modules.items()
        for target, imported in _imports(name, path)
        if imported.startswith("_") and not imported.startswith("__") and target != name
    ]
    assert not offenders, "private names crossing modules (make them public or move the code):\n" + "\n".join(
        offenders
    )


def test_no_import_cycle_between_modules():
    cycles = _cycles(_graph())
    assert not cycles, f"modules that import each other (directly or round a loop): {cycles}"


def test_the_worker_engine_never_imports_the_driver_or_spark():
    """train/ is what runs inside a task; the driver layer (driver/) and the stages (spark/) sit above it."""
    offenders = [
        f"{name} -> {t}"
        for name, targets in _graph().items()
        if name.startswith("sparkdp.train")
        for t in targets
        if t.startswith(("sparkdp.spark", "sparkdp.driver"))
    ]
    assert not offenders, "\n".join(offenders)


def test_the_spark_adapter_never_imports_the_driver():
    """spark/ adapts Spark to the engine below it; the driver (driver/: plans, restarts) sits above
    it and hands it what it needs, so no import arrow runs from spark/ back up to driver/."""
    offenders = [
        f"{name} -> {t}"
        for name, targets in _graph().items()
        if name.startswith("sparkdp.spark")
        for t in targets
        if t.startswith("sparkdp.driver")
    ]
    assert not offenders, "\n".join(offenders)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_graph_reader_sees_the_imports_it_checks():
    # guards the test above against passing because it reads nothing
    imports = _imports("sparkdp.spark.dataframe", _modules()["sparkdp.spark.dataframe"])
    assert ("sparkdp.spark.launcher", "BarrierStage") in imports
    assert "sparkdp.spark.launcher" in _graph()["sparkdp.driver.api"]
