"""Nothing read from the network or a file is unpickled (design rule 7, docs/architecture.md), checked on the source.

Every module of sparkdp, and every script under ``examples/``, ``benchmarks/`` and ``scripts/``
(users copy them), is parsed and searched for the ways Python turns bytes into objects
by running code: the pickle family (``pickle``, ``cloudpickle``, ``dill``, ``jsonpickle``,
``joblib``, Spark's pickle serializers), ``marshal``, ``shelve``, ``pandas.read_pickle``,
``torch.load`` without ``weights_only=True``, ``numpy.load`` with ``allow_pickle``, YAML
loaders other than the safe ones, ``eval``/``exec``, and pickling hooks that choose what runs
when an object is unpickled (``__reduce__``, ``__reduce_ex__``, ``__setstate__``).  Working
on the syntax tree, not the text, means a docstring that names ``pickle.loads`` is no finding
and ``model.eval()`` is not ``eval()``.

Spark itself ships tasks to its executors with cloudpickle.  The lines of sparkdp that take
part in that are listed in :data:`ALLOWED`, each with its reason; an entry that matches
nothing fails too, so the list stays exactly as long as it needs to be.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sparkdp

ROOT = Path(sparkdp.__file__).parent
REPO = Path(__file__).resolve().parent.parent
#: the repository's other Python, which users copy and run: examples, benchmarks, scripts
SCRIPT_DIRS = ("examples", "benchmarks", "scripts")
FILES = sorted(ROOT.rglob("*.py"))
SCRIPTS = sorted(path for name in SCRIPT_DIRS for path in (REPO / name).rglob("*.py"))

# Modules (or any part of a dotted module path) whose loaders unpickle or run code.
_PICKLE_MODULES = {
    "pickle",
    "cPickle",
    "_pickle",
    "cloudpickle",
    "dill",
    "jsonpickle",
    "joblib",
    "marshal",
    "shelve",
    "copyreg",
}
_ATTRIBUTES = {
    "Unpickler": "an Unpickler",
    "read_pickle": "pandas.read_pickle",
    "unsafe_load": "yaml.unsafe_load",
    "unsafe_load_all": "yaml.unsafe_load_all",
    "full_load": "yaml.full_load",
    "full_load_all": "yaml.full_load_all",
}
_SAFE_YAML_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"}
_HOOKS = {"__reduce__", "__reduce_ex__", "__setstate__"}

#: (path under the repository, the line's text) -> why it is not unpickling outside input.
ALLOWED: dict[tuple[str, str], str] = {
    ("src/sparkdp/data/tensors.py", "def __reduce_ex__(self, protocol):"): (
        "Spark pickles a TensorData into the tasks it sends to its own executors; this hook makes that "
        "pickle carry the paths of files the driver wrote (mapped on the executor) instead of the tensor "
        "bytes. Nothing sparkdp reads from a socket or a user's file is unpickled through it."
    ),
}


def _name(node: ast.AST) -> str:
    """``a.b.c`` for a Name/Attribute chain, else ''."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _name(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def _is_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _call_finding(call: ast.Call) -> str | None:
    func = _name(call.func)
    last = func.rsplit(".", 1)[-1]
    if func in ("eval", "exec", "builtins.eval", "builtins.exec"):
        return f"{func}() runs text as code"
    if func in ("torch.load", "torch.serialization.load") and not _is_true(_keyword(call, "weights_only")):
        return "torch.load without weights_only=True unpickles"
    if func in ("np.load", "numpy.load"):
        allow = _keyword(call, "allow_pickle")
        if allow is not None and not (isinstance(allow, ast.Constant) and allow.value is False):
            return "numpy.load with allow_pickle unpickles object arrays"
    if func in ("yaml.load", "yaml.load_all"):
        loader = _keyword(call, "Loader") or (call.args[1] if len(call.args) > 1 else None)
        if loader is None or _name(loader).rsplit(".", 1)[-1] not in _SAFE_YAML_LOADERS:
            return f"{func} without a safe Loader constructs arbitrary Python objects"
    if func.split(".")[0] in _PICKLE_MODULES and last not in ("dump", "dumps"):  # writing runs no one's code
        return f"{func} reads with a pickle-family module"
    return None


def findings(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """``(line, what)`` for every way ``source`` could unpickle or run data as code."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if set(alias.name.split(".")) & _PICKLE_MODULES or "pickle" in alias.name.lower():
                    found.append((node.lineno, f"imports {alias.name}"))
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            for alias in node.names:
                parts = set(module.split(".")) | {alias.name}
                if parts & _PICKLE_MODULES or "pickle" in f"{module}.{alias.name}".lower():
                    found.append((node.lineno, f"imports {alias.name} from {module}"))
        elif isinstance(node, ast.Attribute) and node.attr in _ATTRIBUTES:
            found.append((node.lineno, f"uses {_ATTRIBUTES[node.attr]}"))
        elif isinstance(node, ast.Call):
            what = _call_finding(node)
            if what:
                found.append((node.lineno, what))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in _HOOKS:
            found.append(
                (node.lineno, f"defines {node.name}, which decides what runs when the object is unpickled")
            )
    return sorted(set(found))


def _shown(path: Path) -> str:
    """``path`` as :data:`ALLOWED` names it: under the repository (``src/sparkdp/...``, ``examples/...``)."""
    if path.is_relative_to(ROOT):
        return "src/sparkdp/" + path.relative_to(ROOT).as_posix()
    return path.relative_to(REPO).as_posix()


def _scan() -> dict[tuple[str, str], list[str]]:
    """Every finding in src/sparkdp, examples/, benchmarks/ and scripts/, keyed like :data:`ALLOWED`."""
    out: dict[tuple[str, str], list[str]] = {}
    for path in FILES + SCRIPTS:
        text = path.read_text()
        lines = text.splitlines()
        for line, what in findings(text, str(path)):
            out.setdefault((_shown(path), lines[line - 1].strip()), []).append(f"line {line}: {what}")
    return out


def test_the_scan_sees_every_package():
    names = {p.relative_to(ROOT).parts[0] for p in FILES}
    assert {"ps", "rules", "caffe", "train", "spark", "data", "comm", "state.py", "cli"} <= names
    assert len(FILES) > 50
    scanned = {p.relative_to(REPO).parts[0] for p in SCRIPTS}
    assert scanned == set(SCRIPT_DIRS), f"no Python found under {set(SCRIPT_DIRS) - scanned}"
    assert REPO / "examples" / "run_distribute.py" in SCRIPTS


@pytest.mark.timeout(60)
def test_nothing_is_unpickled_or_evaluated():
    found = _scan()
    offenders = {key: whats for key, whats in found.items() if key not in ALLOWED}
    assert not offenders, "\n".join(
        f"{path}: {'; '.join(whats)}: {text}" for (path, text), whats in offenders.items()
    ) + (
        "\nRead network and file input with a format that cannot run code (safetensors, JSON, the ps "
        "codec); a line that only takes part in Spark's own task shipping goes into ALLOWED with its reason."
    )
    stale = [key for key in ALLOWED if key not in found]
    assert not stale, f"ALLOWED entries that match no line any more (remove them): {stale}"


@pytest.mark.parametrize(
    "source",
    [
        "import pickle",
        "import cPickle",
        "import _pickle as p",
        "from pickle import loads",
        "from pickle import *",
        "import cloudpickle",
        "from pyspark import cloudpickle",
        "from pyspark.cloudpickle import loads",
        "from pyspark.serializers import CPickleSerializer",
        "import dill",
        "import jsonpickle",
        "import joblib",
        "import marshal",
        "from marshal import loads",
        "import shelve",
        "import copyreg",
        "x = pickle.loads(b)",
        "x = pickle.load(f)",
        "x = dill.loads(b)",
        "x = cloudpickle.loads(b)",
        "x = marshal.loads(b)",
        "x = shelve.open(p)['k']",
        "x = joblib.load(p)",
        "x = something.Unpickler(f).load()",
        "x = pd.read_pickle(p)",
        "torch.load(f)",
        "torch.load(f, map_location='cpu')",
        "torch.load(f, weights_only=False)",
        "torch.load(f, weights_only=flag)",
        "torch.serialization.load(f)",
        "np.load(p, allow_pickle=True)",
        "numpy.load(p, allow_pickle=flag)",
        "yaml.load(s)",
        "yaml.load(s, Loader=yaml.Loader)",
        "yaml.load(s, Loader=yaml.FullLoader)",
        "yaml.load(s, yaml.UnsafeLoader)",
        "yaml.load_all(s)",
        "yaml.unsafe_load(s)",
        "yaml.full_load(s)",
        "yaml.unsafe_load_all(s)",
        "eval(text)",
        "exec(code)",
        "builtins.eval(text)",
        "class A:\n    def __reduce__(self):\n        return (os.system, ('id',))",
        "class A:\n    def __reduce_ex__(self, p):\n        return (f, ())",
        "class A:\n    def __setstate__(self, s):\n        pass",
    ],
)
def test_the_scan_catches_each_offender(source):
    assert findings(source), f"the scan misses: {source!r}"


@pytest.mark.parametrize(
    "source",
    [
        "torch.load(f, weights_only=True)",
        "torch.load(f, map_location='cpu', weights_only=True)",
        "np.load(p)",
        "np.load(p, allow_pickle=False)",
        "yaml.safe_load(s)",
        "yaml.load(s, Loader=yaml.SafeLoader)",
        "yaml.load(s, yaml.CSafeLoader)",
        "json.loads(s)",
        "model.eval()",
        "net.eval().cuda()",
        "safetensors.torch.load(b)",
        "class A:\n    def __getstate__(self):\n        return {}",
        '"""Never pickle: sparktorch used dill.loads() and elephas pickle.loads()."""',
        "# torch.load(f) would unpickle",
    ],
)
def test_the_scan_passes_safe_code(source):
    assert not findings(source), f"the scan flags safe code: {source!r}"
