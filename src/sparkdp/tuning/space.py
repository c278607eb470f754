"""The command line's search space: ``KEY=loguniform(LOW,HIGH)``, ``uniform(LOW,HIGH)``,
``int(LOW,HIGH)`` or ``choice(A,B,...)``, parsed strictly (numbers by ``float``/``int``, choice
values as JSON scalars or else plain strings; nothing is evaluated) into :class:`SearchParam`,
each of which asks an ``optuna.Trial`` for its value.

A KEY is a job setting by name (``lr``, ``batch_size``, ``strategy``, ``workers``...), or one
option of the strategy or the built-in model: ``strategy_option.period``, ``model_option.n_layer``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

KINDS = ("loguniform", "uniform", "int", "choice")
#: the prefixes of a KEY that names one entry of a mapping setting, and that setting
OPTION_PREFIXES = {"strategy_option": "strategy_options", "model_option": "model_options"}
_GRAMMAR = "KEY=loguniform(LOW,HIGH), KEY=uniform(LOW,HIGH), KEY=int(LOW,HIGH) or KEY=choice(A,B,...)"
_SEARCH = re.compile(r"\s*([A-Za-z_][\w.-]*)\s*=\s*([a-z]+)\((.*)\)\s*", re.DOTALL)


@dataclass(frozen=True)
class SearchParam:
    """One dimension of the search: the setting it sets and the distribution of its values."""

    key: str
    kind: str
    values: tuple[Any, ...]

    def suggest(self, trial: Any) -> Any:
        if self.kind == "choice":
            return trial.suggest_categorical(self.key, list(self.values))
        low, high = self.values
        if self.kind == "int":
            return trial.suggest_int(self.key, low, high)
        return trial.suggest_float(self.key, low, high, log=self.kind == "loguniform")


def parse_search(text: str, known: Collection[str] | None = None) -> SearchParam:
    """``KEY=KIND(ARGS)`` -> a :class:`SearchParam`; ``known``: the setting names a KEY may be."""
    match = _SEARCH.fullmatch(text)
    if match is None:
        raise ConfigError(f"--search {text!r} is not of the form {_GRAMMAR}.")
    key, kind, inner = match.group(1).replace("-", "_"), match.group(2), match.group(3)
    if kind not in KINDS:
        raise ConfigError(f"--search {text!r}: unknown distribution {kind!r}; use one of {', '.join(KINDS)}.")
    _check_key(text, key, known)
    parts = [p.strip() for p in _split(inner)]
    if kind == "choice":
        if not parts or any(not p for p in parts):
            raise ConfigError(f"--search {text!r}: choice(...) needs one or more values, e.g. choice(32,64).")
        return SearchParam(key, kind, tuple(_scalar(text, p) for p in parts))
    if len(parts) != 2:
        raise ConfigError(f"--search {text!r}: {kind}(LOW,HIGH) takes two numbers; got {len(parts)}.")
    low, high = (_number(text, p, integer=kind == "int") for p in parts)
    if not low < high:
        raise ConfigError(f"--search {text!r}: LOW must be below HIGH; got {low} and {high}.")
    if kind == "loguniform" and low <= 0:
        raise ConfigError(f"--search {text!r}: loguniform needs LOW > 0; use uniform for ranges from 0.")
    return SearchParam(key, kind, (low, high))


def _check_key(text: str, key: str, known: Collection[str] | None) -> None:
    prefix, dot, name = key.partition(".")
    if dot:
        if prefix not in OPTION_PREFIXES or not name:
            raise ConfigError(
                f"--search {text!r}: {key!r} is not a setting; a dotted KEY is "
                "strategy_option.NAME or model_option.NAME."
            )
        return
    if known is not None and key not in known:
        raise ConfigError(
            f"--search {text!r}: {key!r} is not a job setting; use one of {', '.join(sorted(known))}, "
            "strategy_option.NAME or model_option.NAME."
        )


def _split(inner: str) -> list[str]:
    """Split at the commas outside quotes and brackets (a choice may be a string holding a comma;
    a JSON list is one value, refused by :func:`_scalar`)."""
    parts: list[str] = []
    current: list[str] = []
    quote: str | None = None
    depth = 0
    for ch in inner:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    if inner.strip():
        parts.append("".join(current))
    return parts


def _number(text: str, part: str, *, integer: bool) -> float | int:
    try:
        return int(part) if integer else float(part)
    except ValueError:
        what = "an integer" if integer else "a number"
        raise ConfigError(f"--search {text!r}: {part!r} is not {what}.") from None


def _scalar(text: str, part: str) -> Any:
    """A choice value: a JSON number, true/false/null or quoted string, else the text itself."""
    if part[0] in "'" and part[-1] == part[0] and len(part) > 1:
        return part[1:-1]
    try:
        value = json.loads(part)
    except json.JSONDecodeError:
        return part
    if isinstance(value, (list, dict)):
        raise ConfigError(
            f"--search {text!r}: choice values are numbers, true/false or strings; {part!r} is not."
        )
    return value


def apply(settings: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with a trial's ``params`` set (a dotted KEY sets one entry of its mapping)."""
    out = dict(settings)
    for key, value in params.items():
        prefix, dot, name = key.partition(".")
        if dot:
            mapping = OPTION_PREFIXES[prefix]
            out[mapping] = {**(out.get(mapping) or {}), name: value}
        else:
            out[key] = value
    return out


__all__ = ["KINDS", "SearchParam", "apply", "parse_search"]
