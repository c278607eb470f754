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
    return found


def test_no_module_imports_another_modules_private_names():
    modules = _modules()
    offenders = [f"{name} imports {target}.{imported}"
                 for name, path in modules.items() for target, imported in _imports(name, path)
                 if imported.startswith("_") and not imported.startswith("__") and target != name]
    assert not offenders, "private names crossing modules (make them public or move the code):\n" + "\n".join(offenders)


def test_the_graph_reader_sees_the_imports_it_checks():
    # guards the test above against passing because it reads nothing
    imports = _imports("sparkdp.spark.dataframe", _modules()["sparkdp.spark.dataframe"])
    assert ("sparkdp.spark.launcher", "BarrierStage") in imports
