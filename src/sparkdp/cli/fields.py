"""Command-line flags and YAML job-file keys generated from settings dataclasses.

Each field of a settings class (``sparkdp.config``, and the commands' own input classes)
becomes a flag named after it (``batch_size`` → ``--batch-size``) with its type, choices and
help text (the class docstring's ``Attributes:`` entry), and a job-file key of the same name.
Nothing here lists a setting by name: a field added to a class appears everywhere.

A flag's default is None ("not given"), so a value from a job file, a script or the class's
own default can fill it in; :func:`given` returns only what was set.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..config import GROUPS, field_docs, key_value
from ..errors import ConfigError


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    kind: Any  # int, float, str, bool, dict (a mapping) or Any
    optional: bool
    default: Any
    meta: Mapping[str, Any]
    help: str

    @property
    def flag(self) -> str:
        return self.meta.get("flag") or "--" + self.name.replace("_", "-")

    @property
    def keys(self) -> list[str]:
        """The job-file spellings: the name, and the long flags' names."""
        flags = [self.flag, *self.meta.get("aliases", ())]
        return [self.name, *(f[2:].replace("-", "_") for f in flags if f.startswith("--"))]


def _fields(cls: type, only: Iterable[str] | None = None) -> list[_Field]:
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    wanted = None if only is None else set(only)
    out = []
    for f in dataclasses.fields(cls):
        if wanted is not None and f.name not in wanted:
            continue
        kind, optional = hints[f.name], False
        if typing.get_origin(kind) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(kind) if a is not type(None)]
            optional, kind = len(args) < len(typing.get_args(kind)), (args[0] if len(args) == 1 else Any)
        if typing.get_origin(kind) is not None and issubclass(typing.get_origin(kind), Mapping):
            kind = dict
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if f.name not in docs:
            raise TypeError(
                f"{cls.__name__}.{f.name} has no entry in the class docstring's Attributes: section, "
                "which is its help text"
            )
        out.append(_Field(f.name, kind, optional or default is None, default, f.metadata, docs[f.name]))
    return out


def _mapping_item(parse: Any) -> Any:
    """``parse`` (text → ``(KEY, VALUE)``) as an argparse type whose refusal argparse shows as the
    flag's one error line (it shows the message of an ``ArgumentTypeError`` only)."""

    def item(text: str) -> tuple[str, Any]:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return item


class _MappingOption(argparse.Action):
    """A repeatable ``KEY=VALUE`` flag collected into a dict over the job file's mapping."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        key, value = values
        setattr(namespace, self.dest, {**(getattr(namespace, self.dest) or {}), key: value})


def add_settings(
    parser: Any, cls: type, *, only: Iterable[str] | None = None, title: str | None = None
) -> None:
    """Add ``cls``'s fields (or those named in ``only``) to ``parser`` as an argument group."""
    group = parser.add_argument_group(title or (cls.__doc__ or cls.__name__).split("\n")[0].rstrip("."))
    for f in _fields(cls, only):
        meta = f.meta
        names = [f.flag, *meta.get("aliases", ())]
        shown = (
            "" if f.default is None or f.default is False or f.default == {} else f" (default {f.default})"
        )
        if meta.get("positional"):
            group.add_argument(f.name, nargs="?", default=None, help=f.help)
        elif f.kind is bool:
            group.add_argument(
                *names, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=f.help + shown
            )
            if meta.get("negative"):
                group.add_argument(
                    *meta["negative"],
                    dest=f.name,
                    action="store_false",
                    default=None,
                    help=f"same as --no-{f.flag[2:]}",
                )
        elif f.kind is dict:
            group.add_argument(
                *names,
                dest=f.name,
                action=_MappingOption,
                default=None,
                type=_mapping_item(meta.get("parse") or key_value),
                metavar=meta.get("metavar"),
                help=f.help + " (repeatable)",
            )
        else:
            kind = meta.get("parse") or (f.kind if f.kind in (int, float) else str)
            group.add_argument(
                *names,
                dest=f.name,
                type=kind,
                default=None,
                choices=meta.get("choices"),
                metavar=meta.get("metavar"),
                action=meta.get("action"),
                help=f.help + shown,
            )


def add_job_settings(
    parser: argparse.ArgumentParser, classes: tuple[tuple[type, Any], ...], run: Any
) -> None:
    """A command's settings flags, ``--config JOB.yaml`` and ``--print-config``; ``run(args)`` runs it.

    ``classes`` are (settings class, the fields taken or None for all); ``sparkdp.cli.main``
    reads a job file into the flags' defaults and answers ``--print-config``."""
    for cls, only in classes:
        add_settings(parser, cls, only=only)
    parser.add_argument(
        "--config",
        metavar="JOB.yaml",
        help="read settings from a YAML job file (flags override "
        "it); its keys are the settings' names, e.g. batch_size: 64",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective settings as YAML (a job file) and exit",
    )
    parser.set_defaults(func=run, settings=classes, parser=parser)


def job_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The job settings (``sparkdp.config``'s groups) a command's flags and job file set, by name."""
    return {
        name: value
        for cls, only in args.settings
        if cls in GROUPS.values()
        for name, value in given(args, cls, only=only).items()
    }


def given(args: argparse.Namespace, cls: type, *, only: Iterable[str] | None = None) -> dict[str, Any]:
    """The fields of ``cls`` that were set (a flag or a job file), by name."""
    return {
        f.name: getattr(args, f.name) for f in _fields(cls, only) if getattr(args, f.name, None) is not None
    }


def load_job_file(path: str, classes: Iterable[tuple[type, Iterable[str] | None]]) -> dict[str, Any]:
    """A YAML job file's settings (keys: the fields' names), each checked against its field's type."""
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
        raise ConfigError(
            f"the job file {path!r} must be a mapping of setting: value; it holds a {type(values).__name__}."
        )
    known = {key: f for cls, only in classes for f in _fields(cls, only) for key in f.keys}
    out: dict[str, Any] = {}
    for raw_key, value in values.items():
        key = str(raw_key).replace("-", "_")
        if key not in known:
            names = sorted({f.name for f in known.values()})
            close = difflib.get_close_matches(key, names, n=1)
            raise ConfigError(
                f"{path}: unknown setting {raw_key!r}"
                + (f" (did you mean {close[0]!r}?)" if close else "")
                + f"; allowed: {', '.join(names)}."
            )
        f = known[key]
        out[f.name] = _checked(path, str(raw_key), value, f)
    return out


def _checked(path: str, key: str, value: Any, f: _Field) -> Any:
    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{path}: {key} is {value!r} ({type(value).__name__}); expected {expected}.")

    if value is None:
        if not f.optional:
            raise bad(f"a value (it has no 'none'; its default is {f.default!r})")
        return None
    if f.kind is bool and not isinstance(value, bool):
        raise bad("true or false")
    if f.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise bad("an integer")
    if f.kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise bad("a number")
    if f.kind is str and not isinstance(value, str):
        raise bad("a string")
    if f.kind is dict and not isinstance(value, dict):
        raise bad("a mapping of option: value")
    choices = f.meta.get("choices")
    if choices is not None and value not in choices:
        raise bad(f"one of {', '.join(map(str, choices))}")
    if f.kind is not str and isinstance(value, str) and f.meta.get("parse"):
        return f.meta["parse"](value)  # a field typed loosely (Any) whose file value is its flag's text
    return float(value) if f.kind is float else value


def effective_config(args: argparse.Namespace, classes: Iterable[tuple[type, Iterable[str] | None]]) -> str:
    """The settings as YAML: what ``--print-config`` shows, itself a valid job file."""
    import yaml

    values: dict[str, Any] = {}
    for cls, only in classes:
        for f in _fields(cls, only):
            value = getattr(args, f.name, None)
            value = f.default if value is None else value
            values[f.name] = _plain(value)
    return yaml.safe_dump(values, sort_keys=True)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
