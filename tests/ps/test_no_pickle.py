"""Network and checkpoint input is never unpickled (design rule 7, docs/architecture.md), checked on the source text."""

import re
from pathlib import Path

import pytest

import sparkdp

ROOT = Path(sparkdp.__file__).parent
FILES = sorted(p for d in ("ps", "rules") for p in (ROOT / d).rglob("*.py"))
FORBIDDEN = re.compile(
    r"^\s*(import|from)\s+(pickle|cPickle|_pickle|dill|cloudpickle|marshal|shelve)\b|\b(pickle|dill|cloudpickle|marshal)\.loads?\(",
    re.M,
)
TORCH_LOAD = re.compile(r"torch\.load\((?P<args>[^)]*)\)")


def test_the_scan_sees_the_modules():
    assert any(p.name == "codec.py" for p in FILES) and any(p.parent.name == "rules" for p in FILES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_unpickling(path):
    text = path.read_text()
    assert not FORBIDDEN.search(text), f"{path} uses a pickle-family module"
    for m in TORCH_LOAD.finditer(text):
        assert "weights_only=True" in m.group("args"), f"{path}: torch.load without weights_only=True"


def test_the_scan_would_catch_offenders():
    assert FORBIDDEN.search("import pickle\n") and FORBIDDEN.search("x = dill.loads(b)")
    assert FORBIDDEN.search("from cloudpickle import loads")
    assert "weights_only=True" not in TORCH_LOAD.search("torch.load(f)").group("args")
