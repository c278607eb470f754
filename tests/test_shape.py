"""The package's shape, read from the source (no imports): one place builds the job controller,
its restart policy and the checkpoint store; no module reads another module's private
attributes; the driver's and the worker's functions stay short; one module of train/ reads whether
a worker is synchronous."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

SRC = Path(__file__).resolve().parents[1] / "src" / "sparkdp"
#: the longest function body (its docstring left out) a driver/ or train/ module may hold
MAX_LINES = 80


def _modules() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(), str(p)) for p in sorted(SRC.rglob("*.py"))}


def _construction_sites(modules: dict[Path, ast.Module], cls: str) -> list[str]:
    """Where ``cls(...)`` or ``cls.<classmethod>(...)`` is called, as ``path:line``."""
    sites = []
    for path, tree in modules.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if (isinstance(func, ast.Name) and func.id == cls) or (
                isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == cls
            ):
                sites.append(f"{path.relative_to(SRC)}:{node.lineno}")
    return sites


def test_the_controller_and_its_two_policies_are_each_built_at_one_site():
    modules = _modules()
    for cls in ("Controller", "RestartPolicy", "ScalingPolicy"):
        assert len(_construction_sites(modules, cls)) == 1, _construction_sites(modules, cls)


def test_only_the_checkpoint_manager_builds_a_checkpoint_store():
    sites = _construction_sites(_modules(), "CheckpointStore")
    assert len(sites) <= 2 and all(s.startswith("train/checkpoint_manager.py:") for s in sites), sites


def test_the_sentinel_reader_identity_is_written_in_one_place():
    hits = [
        f"{path.relative_to(SRC)}:{node.lineno}"
        for path, tree in _modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value == "reader"
    ]
    assert len(hits) == 1 and hits[0].startswith("train/checkpoint_manager.py:"), hits


def _private_attributes(tree: ast.Module) -> set[str]:
    """The private attributes a module defines: ``self._x = ...``, class-level ``_x``, methods ``_x``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("_"):
            names.add(node.name)
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, (ast.AnnAssign, ast.AugAssign))
            else []
        )
        for t in targets:
            for leaf in ast.walk(t):
                if isinstance(leaf, ast.Attribute) and leaf.attr.startswith("_"):
                    names.add(leaf.attr)
                elif isinstance(leaf, ast.Name) and leaf.id.startswith("_"):
                    names.add(leaf.id)
    return {n for n in names if not (n.startswith("__") and n.endswith("__"))}


def _foreign_reads(modules: dict[Path, ast.Module]) -> list[str]:
    """``obj._name`` where ``obj`` is not ``self``/``cls`` and ``_name`` is defined only in other
    modules of the package: one module reading another's private attribute."""
    defined = {path: _private_attributes(tree) for path, tree in modules.items()}
    elsewhere = Counter(name for names in defined.values() for name in names)
    found = []
    for path, tree in modules.items():
        own = defined[path]
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
                continue
            if node.attr.startswith("__") or node.attr in own or node.attr not in elsewhere:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            found.append(f"{path.relative_to(SRC)}:{node.lineno} .{node.attr}")
        for node in ast.walk(tree):  # getattr(obj, "_name"...) reads it too
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and node.args[1].value in elsewhere
                and node.args[1].value not in own
                and not (isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls"))
            ):
                found.append(f"{path.relative_to(SRC)}:{node.lineno} .{node.args[1].value}")
    return found


def test_the_private_attribute_check_finds_a_read_across_modules():
    """The check itself, on two small modules: a read of the other's private attribute is found,
    reads of one's own and through self are not."""
    a = ast.parse("class A:\n    def __init__(self):\n        self._hidden = 1\n        self._mine = 2\n")
    b = ast.parse(
        "def peek(a):\n    return a._hidden\n\nclass B:\n    def f(self):\n        return self._hidden\n"
        "\ndef look(a):\n    return getattr(a, '_hidden', None)\n"
    )
    assert _foreign_reads({SRC / "a.py": a, SRC / "b.py": b}) == ["b.py:2 ._hidden", "b.py:9 ._hidden"]


def test_no_module_reads_another_modules_private_attributes():
    assert _foreign_reads(_modules()) == []


def _long_functions(folder: str) -> list[str]:
    found = []
    for path in sorted((SRC / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            body = node.body
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:] or body  # the docstring is not code
            lines = (body[-1].end_lineno or body[-1].lineno) - body[0].lineno + 1
            if lines > MAX_LINES:
                found.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({lines} lines)")
    return found


@pytest.mark.parametrize("package", ["driver", "train"])
def test_no_function_of_the_package_is_longer_than_80_lines(package):
    assert _long_functions(package) == []


def _reads_of_independent(folder: str) -> set[str]:
    """The modules under ``folder`` that read ``.independent`` (the sync/async decision) or
    ``getattr(..., "independent")``."""
    found = set()
    for path in sorted((SRC / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            attribute = isinstance(node, ast.Attribute) and node.attr == "independent"
            by_name = (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value == "independent"
            )
            if attribute or by_name:
                found.add(str(path.relative_to(SRC)))
    return found


def test_one_train_module_reads_whether_a_worker_is_synchronous():
    assert _reads_of_independent("train") == {"train/role.py"}


def _tree_files(package: str) -> set[str]:
    """The module files docs/architecture.md's package tree names under ``package``/ (its
    sub-packages' included), by path relative to it."""
    text = (SRC.parents[1] / "docs" / "architecture.md").read_text()
    tree = text.split("## Package tree", 1)[1].split("```", 2)[1]
    lines = tree.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"  {package}/"))
    files, folder = set(), ""
    for line in lines[start + 1 :]:
        if line.startswith("  ") and not line.startswith("   "):
            break  # the next package
        found = re.match(r"^( {4,})((?:\w+\.py,? ?)+|\w+/)", line)
        if found is None:
            continue
        if found[2].endswith("/"):
            folder = found[2]
            continue
        inner = folder if len(found[1]) > 4 else ""
        files |= {inner + name for name in re.findall(r"\w+\.py", found[2])}
    return files


@pytest.mark.parametrize("package", ["driver", "train"])
def test_the_architecture_notes_tree_names_every_module_of_the_package(package):
    on_disk = {
        str(p.relative_to(SRC / package)) for p in (SRC / package).rglob("*.py") if p.name != "__init__.py"
    }
    assert _tree_files(package) == on_disk
