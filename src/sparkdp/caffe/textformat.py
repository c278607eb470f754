"""A schema-less parser for the protobuf text format used by Caffe's ``.prototxt`` files.

The parser knows nothing about Caffe: it turns text into nested :class:`Message`
objects that keep every field in file order, so repeated fields and the position of
each message (for error messages) survive.  Typing and validation live in
:mod:`sparkdp.caffe.spec`.

Example:
    >>> m = parse('name: "LeNet" layer { name: "conv1" top: "conv1" }')
    >>> m.get("name"), m.get("layer").getall("top")
    ('LeNet', ['conv1'])
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

__all__ = ["Identifier", "Message", "TextFormatError", "parse", "parse_file"]


class TextFormatError(ConfigError):
    """A syntax error, reported as ``FILE:LINE:COL: expected X, found Y``."""


class Identifier(str):
    """A bare token such as ``MAX``, ``TRAIN`` or ``LMDB`` (an enum value)."""

    def __repr__(self) -> str:
        return f"Identifier({str(self)!r})"


@dataclass
class Message:
    """One message: its fields as ``(name, value)`` pairs in file order.

    Values are ``str``, ``int``, ``float``, ``bool``, :class:`Identifier` or a nested
    :class:`Message`.  A repeated field appears once per value.
    """

    fields: list[tuple[str, Any]] = field(default_factory=list)
    line: int = field(default=0, compare=False)
    column: int = field(default=0, compare=False)
    filename: str = field(default="<string>", compare=False)
    positions: list[tuple[int, int]] = field(default_factory=list, compare=False, repr=False)

    def get(self, name: str, default: Any = None) -> Any:
        """The last value of field ``name`` (protobuf's "last one wins"), or ``default``."""
        for key, value in reversed(self.fields):
            if key == name:
                return value
        return default

    def getall(self, name: str) -> list[Any]:
        """All values of a repeated field, in file order."""
        return [value for key, value in self.fields if key == name]

    def has(self, name: str) -> bool:
        return any(key == name for key, _ in self.fields)

    def names(self) -> list[str]:
        """Distinct field names in order of first appearance."""
        return list(dict.fromkeys(key for key, _ in self.fields))

    def where(self, index: int | None = None) -> str:
        """``FILE:LINE:COL`` of field number ``index`` (when the parser recorded it) or of the message."""
        if index is not None and index < len(self.positions):
            return f"{self.filename}:{self.positions[index][0]}:{self.positions[index][1]}"
        return f"{self.filename}:{self.line}:{self.column}"

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(self.fields)


# --------------------------------------------------------------------------- lexer

# A number is matched longest-first inside an atomic group, ``(?>...)``: when the character
# after it is one a number cannot be followed by, the match fails at once instead of
# backtracking over every way of splitting a digit run (``\d+\.?\d*`` could split N digits
# N ways, each re-checked: quadratic time, hours for a megabyte of digits).  No shorter
# match could succeed anyway: it would end before a digit, '.', or letter of the number
# itself, all of which the look-ahead refuses.  The pattern is kept unambiguous too
# (``\d+(?:\.\d*)?``), so it stays linear where atomic groups are not available.
_NUMBER = r"(?:0[xX][0-9a-fA-F]+|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?[fF]?)"
_ATOMIC_NUMBER = f"(?>{_NUMBER})" if sys.version_info >= (3, 11) else _NUMBER
_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t\r\f\v]+) | (?P<nl>\n) | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<number>"""
    + _ATOMIC_NUMBER
    + r"""(?![A-Za-z0-9_.]))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<symbol>[{}<>\[\]:;,\-])
    """,
    re.VERBOSE,
)
_UNTERMINATED = re.compile(r"""["'][^\n]*""")
_SIMPLE_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "?": "?",
}
_ESCAPE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.))")


@dataclass
class _Token:
    kind: str  # string | number | ident | symbol | eof
    text: str
    line: int
    column: int

    def describe(self) -> str:
        return "end of file" if self.kind == "eof" else repr(self.text)


def _tokenize(text: str, filename: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos, line, line_start = 0, 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        column = pos - line_start + 1
        if m is None:
            bad = _UNTERMINATED.match(text, pos)
            what = "unterminated string" if bad else repr(text[pos])
            raise TextFormatError(
                f"{filename}:{line}:{column}: expected a field, value or symbol, found {what}"
            )
        kind = m.lastgroup or ""
        if kind == "nl":
            line, line_start = line + 1, m.end()
        elif kind not in ("ws", "comment"):
            tokens.append(_Token(kind, m.group(), line, column))
        pos = m.end()
    tokens.append(_Token("eof", "", line, pos - line_start + 1))
    return tokens


def _unescape(body: str, where: str) -> str:
    def one(m: re.Match[str]) -> str:
        octal, hex2, u4, u8, simple = m.groups()
        if octal:
            return chr(int(octal, 8))
        if hex2 or u4 or u8:
            code = int(hex2 or u4 or u8, 16)
            if code > 0x10FFFF:
                raise TextFormatError(
                    f"{where}: escape '\\U{u8}' is beyond the last Unicode code point U+10FFFF"
                )
            return chr(code)
        if simple in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[simple]
        raise TextFormatError(f"{where}: expected a valid escape sequence, found '\\{simple}'")

    return _ESCAPE.sub(one, body)


# -------------------------------------------------------------------------- parser

_FLOAT_WORDS = {"inf": math.inf, "infinity": math.inf, "nan": math.nan}
_BOOL_WORDS = {"true": True, "True": True, "false": False, "False": False}
#: nesting depth protobuf's own parsers accept by default (deeper input would exhaust the stack)
MAX_DEPTH = 100


class _Parser:
    def __init__(self, text: str, filename: str) -> None:
        self.filename = filename
        self.tokens = _tokenize(text, filename)
        self.i = 0
        self.depth = 0

    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def where(self, tok: _Token) -> str:
        return f"{self.filename}:{tok.line}:{tok.column}"

    def fail(self, expected: str, tok: _Token | None = None) -> TextFormatError:
        tok = tok or self.tok
        return TextFormatError(f"{self.where(tok)}: expected {expected}, found {tok.describe()}")

    def accept(self, *symbols: str) -> _Token | None:
        if self.tok.kind == "symbol" and self.tok.text in symbols:
            tok = self.tok
            self.i += 1
            return tok
        return None

    def message_body(self, msg: Message, close: str | None) -> Message:
        while True:
            tok = self.tok
            if close is None and tok.kind == "eof":
                return msg
            if close is not None and self.accept(close):
                return msg
            if tok.kind != "ident":
                expected = "a field name" if close is None else f"a field name or {close!r}"
                raise self.fail(expected)
            self.i += 1
            before = len(msg.fields)
            self.field(msg, tok.text)
            msg.positions.extend([(tok.line, tok.column)] * (len(msg.fields) - before))
            self.accept(";", ",")

    def field(self, msg: Message, name: str) -> None:
        colon = self.accept(":")
        if self.tok.kind == "symbol" and self.tok.text in "{<":
            msg.fields.append((name, self.submessage()))
        elif colon is None:
            raise self.fail(f"':' or '{{' after field {name!r}")
        elif self.accept("["):
            self.list_value(msg, name)
        else:
            msg.fields.append((name, self.scalar()))

    def submessage(self) -> Message:
        open_tok = self.tok
        self.i += 1
        close = "}" if open_tok.text == "{" else ">"
        sub = Message(line=open_tok.line, column=open_tok.column, filename=self.filename)
        if self.tok.kind == "eof":
            raise self.fail(f"{close!r} to close the message opened at {self.where(open_tok)}")
        if self.depth >= MAX_DEPTH:
            raise TextFormatError(
                f"{self.where(open_tok)}: messages nested more than {MAX_DEPTH} deep; "
                "no Caffe file needs that many levels"
            )
        self.depth += 1
        try:
            return self.message_body(sub, close)
        except TextFormatError as err:
            if self.tok.kind == "eof":
                raise self.fail(f"{close!r} to close the message opened at {self.where(open_tok)}") from err
            raise
        finally:
            self.depth -= 1

    def list_value(self, msg: Message, name: str) -> None:
        if self.accept("]"):
            return
        while True:
            if self.tok.kind == "symbol" and self.tok.text in "{<":
                msg.fields.append((name, self.submessage()))
            else:
                msg.fields.append((name, self.scalar()))
            if self.accept("]"):
                return
            if not self.accept(","):
                raise self.fail("',' or ']' in a list")

    def scalar(self) -> Any:
        tok = self.tok
        if tok.kind == "string":
            parts = []
            while self.tok.kind == "string":  # adjacent strings concatenate, as in C
                parts.append(_unescape(self.tok.text[1:-1], self.where(self.tok)))
                self.i += 1
            return "".join(parts)
        negative = self.accept("-") is not None
        tok = self.tok
        if tok.kind == "number":
            self.i += 1
            return _number(tok.text, negative, self.where(tok))
        if tok.kind == "ident":
            word = tok.text
            if word.lower() in _FLOAT_WORDS:
                self.i += 1
                value = _FLOAT_WORDS[word.lower()]
                return -value if negative else value
            if not negative:
                self.i += 1
                return _BOOL_WORDS.get(word, Identifier(word))
        raise self.fail("a number after '-'" if negative else "a value")


def _number(text: str, negative: bool, where: str) -> int | float:
    sign = -1 if negative else 1
    is_hex = text[:2] in ("0x", "0X")
    if is_hex or re.fullmatch(r"\d+", text):
        # protobuf integers have 64 bits: check the length before converting (Python refuses
        # to convert strings of more than 4,300 digits, with a ValueError)
        digits, base = (text[2:], 16) if is_hex else (text, 10)
        digits = digits.lstrip("0") or "0"
        value = int(digits, base) if len(digits) <= (16 if is_hex else 20) else 1 << 64
        if value >= 1 << 64:
            raise TextFormatError(
                f"{where}: integer {text[:24]}{'...' if len(text) > 24 else ''} does not fit in 64 bits"
            )
        return sign * value
    return sign * float(text.rstrip("fF"))


def parse(text: str, filename: str = "<string>") -> Message:
    """Parse protobuf text format into a :class:`Message`.

    Args:
        text: the file's contents.
        filename: used in error messages (``FILE:LINE:COL: expected X, found Y``).

    Raises:
        TextFormatError: on any syntax error.
    """
    parser = _Parser(text, filename)
    return parser.message_body(Message(line=1, column=1, filename=filename), None)


def parse_file(path: str | os.PathLike[str]) -> Message:
    """Read and parse a ``.prototxt`` file."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as err:
        raise ConfigError(f"cannot read Caffe text file {os.fspath(path)!r}: {err.strerror or err}") from err
    return parse(text, os.fspath(path))
