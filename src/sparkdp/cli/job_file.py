"""YAML job files for ``sparkdp train --config job.yaml``.

A job file is a mapping whose keys are ``sparkdp train``'s flags with ``_`` for ``-``
(``batch_size: 64``, ``checkpoint_dir: ckpt``), so the file, the flags and ``sparkdp.fit``'s
keywords share one schema (``sparkdp.config.JobConfig`` checks the values). The file's values
become the flags' defaults: a flag given on the command line overrides the file.
``--print-config`` prints the effective configuration in this format.
"""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import Any

from ..errors import ConfigError

#: argparse destinations that are not job settings
_NOT_SETTINGS = {"func", "config", "print_config", "verbose", "command", "help"}


def settings(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The job settings ``parser`` accepts, by key."""
    return {a.dest: a for a in parser._actions if a.dest not in _NOT_SETTINGS and a.dest != argparse.SUPPRESS}


def load_job_file(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The file's settings as argparse defaults, each checked against the flag it stands for."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the job file {path!r}: {exc.strerror or exc}.") from None
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"the job file {path!r} is not valid YAML: {exc}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"the job file {path!r} must be a mapping of setting: value; it holds a "
                          f"{type(values).__name__}.")
    known = settings(parser)
    out: dict[str, Any] = {}
    for raw_key, value in values.items():
        key = str(raw_key).replace("-", "_")
        if key == "strategy_options" and isinstance(value, dict):  # fit's spelling: a mapping
            key, value = "strategy_option", list(value.items())
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=1)
            raise ConfigError(f"{path}: unknown setting {raw_key!r}"
                              + (f" (did you mean {close[0]!r}?)" if close else "")
                              + f"; allowed: {', '.join(sorted(known))}.")
        out[key] = _checked(path, key, value, known[key])
    return out


def _checked(path: str, key: str, value: Any, action: argparse.Action) -> Any:
    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{path}: {key} is {value!r} ({type(value).__name__}); expected {expected}.")

    if value is None:
        return None
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if key == "strategy_option":
        if not isinstance(value, list) or not all(isinstance(kv, (list, tuple)) and len(kv) == 2 for kv in value):
            raise bad("a mapping of option: value (strategy_options)")
        return [tuple(kv) for kv in value]
    kind = action.type
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise bad("an integer")
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise bad("a number")
    if kind in (None, str) and not isinstance(value, str):
        raise bad("a string")
    if action.choices is not None and value not in action.choices:
        raise bad(f"one of {', '.join(map(str, action.choices))}")
    return float(value) if kind is float else value


def effective_config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    """The settings as YAML (what ``--print-config`` shows; a valid job file)."""
    import yaml

    values = {}
    for key in settings(parser):
        value = getattr(args, key, None)
        if key == "strategy_option":
            key, value = "strategy_options", dict(value or [])
        values[key] = value
    return yaml.safe_dump(values, sort_keys=True)
