"""MkDocs hooks for the user guide (``mkdocs.yml``: ``hooks``).

* ``<!-- cli-reference -->`` in a page becomes the reference of every ``sparkdp`` subcommand,
  generated from the argument parsers themselves (``sparkdp.cli.main.build_parser``), so the
  page cannot drift from the flags.
* Every ``examples/NAME.py`` named in a page's text must exist, and every example must be
  shown on some page: an example that is renamed or added without its page fails the build.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- cli-reference -->"
_EXAMPLE = re.compile(r"(?<![\w/])examples/[\w/]+\.py")  # not tests/examples/...
_shown: set[str] = set()


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse has no public accessor for its subparsers
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    value = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
    return ", ".join(f"`{flag}{value}`" for flag in action.option_strings)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _command(name: str, parser: argparse.ArgumentParser) -> str:
    lines = [f"## sparkdp {name}", ""]
    if parser.description:
        lines += [_cell(parser.description), ""]
    # argparse indents continuation lines under "usage: "; the page shows the usage without it
    first, *rest = parser.format_usage().strip().splitlines()
    usage = "\n".join(
        [first.removeprefix("usage: "), *(line.removeprefix(" " * len("usage: ")) for line in rest)]
    )
    lines += ["```text", usage, "```", "", "| argument | meaning | default |", "|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        default = action.default
        shown = "" if default in (None, False, [], argparse.SUPPRESS) or action.nargs == 0 else f"`{default}`"
        lines.append(f"| {_flags(action)} | {_cell(action.help or '')} | {shown} |")
    return "\n".join(lines) + "\n"


def cli_reference() -> str:
    from sparkdp.cli.main import build_parser

    parser = build_parser()
    verbose = next(a for a in parser._actions if "--verbose" in a.option_strings)
    parts = [
        f"`sparkdp [-v | -vv] COMMAND ...`: before the command, `-v` / `--verbose` gives "
        f"{_cell(verbose.help)}.",
        "",
    ]
    for name, sub in _subcommands(parser).items():
        parts.append(_command(name, sub))
        nested = _subcommands(sub)
        parts += [_command(f"{name} {inner}", p) for inner, p in nested.items()]
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:
    for name in _EXAMPLE.findall(markdown):
        if not (ROOT / name).is_file():
            raise PluginError(f"{page.file.src_uri}: names {name}, which does not exist")
        _shown.add(name)
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    return markdown


def on_post_build(config) -> None:
    missing = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "examples").glob("*.py")
        if str(p.relative_to(ROOT)) not in _shown
    )
    _shown.clear()
    if missing:
        raise PluginError(f"examples shown on no page of the guide: {', '.join(missing)}")
