"""The generic protobuf text-format parser: every syntax form and located errors."""

from __future__ import annotations

import math
import time

import pytest

from sparkdp.caffe.textformat import Identifier, Message, TextFormatError, parse, parse_file
from sparkdp.errors import ConfigError


def test_scalars_strings_and_comments():
    m = parse(
        """
        # a comment
        name: "LeNet"   # trailing comment
        other: 'single'
        esc: "tab\\there \\"q\\" \\x41\\101 \\n"
        joined: "ab" 'cd'
          "ef"
        i: 42  neg: -7  hex: 0x1F  negh: -0x10
        f1: 1e-4 f2: .5 f3: 5. f4: -2.5E+3 f5: 1.5f
        inf1: inf inf2: -inf nan1: nan
        t: true f: false
        e: MAX
        """
    )
    assert m.get("name") == "LeNet" and m.get("other") == "single"
    assert m.get("esc") == 'tab\there "q" AA \n'
    assert m.get("joined") == "abcdef"
    assert (m.get("i"), m.get("neg"), m.get("hex"), m.get("negh")) == (42, -7, 31, -16)
    assert all(isinstance(m.get(k), int) for k in ("i", "neg", "hex"))
    assert (m.get("f1"), m.get("f2"), m.get("f3"), m.get("f4"), m.get("f5")) == (1e-4, 0.5, 5.0, -2500.0, 1.5)
    assert isinstance(m.get("f3"), float)
    assert m.get("inf1") == math.inf and m.get("inf2") == -math.inf and math.isnan(m.get("nan1"))
    assert m.get("t") is True and m.get("f") is False
    assert m.get("e") == "MAX" and isinstance(m.get("e"), Identifier)


def test_message_forms_lists_and_separators():
    m = parse(
        """
        a { x: 1 }
        b: { x: 2; y: 3, }
        c < x: 4 >
        c: < x: 5 >
        mean_value: [104, 117, 123.5]
        empty: []
        msgs: [{ v: 1 }, { v: 2 }]
        layer { name: "n" layer { deep: true } };
        """
    )
    assert m.get("a").get("x") == 1
    assert m.get("b").getall("y") == [3]
    assert [c.get("x") for c in m.getall("c")] == [4, 5]
    assert m.getall("mean_value") == [104, 117, 123.5]
    assert m.getall("empty") == [] and not m.has("empty")
    assert [v.get("v") for v in m.getall("msgs")] == [1, 2]
    assert m.get("layer").get("layer").get("deep") is True
    assert m.names() == ["a", "b", "c", "mean_value", "msgs", "layer"]


def test_repeated_fields_keep_order_and_get_returns_last():
    m = parse('top: "a" bottom: "x" top: "b" top: "c"')
    assert m.getall("top") == ["a", "b", "c"]
    assert m.get("top") == "c"
    assert m.get("missing", 7) == 7
    assert m.fields[1] == ("bottom", "x")


def test_positions_are_recorded_but_do_not_affect_equality():
    m = parse('\n\n  layer {\n name: "x" }', filename="net.prototxt")
    layer = m.get("layer")
    assert (layer.line, layer.column, layer.filename) == (3, 9, "net.prototxt")
    assert layer == parse('layer{name:"x"}').get("layer")
    assert layer.where() == "net.prototxt:3:9"


@pytest.mark.parametrize(
    ("text", "where", "expected", "found"),
    [
        ('name: "x"\nlayer { name "y" }', "2:14", "':' or '{' after field 'name'", "'\"y\"'"),
        ("a: 1\n  b: }", "2:6", "a value", "'}'"),
        ("layer {\n  name: 'x'\n", "3:1", "'}' to close the message opened at f.prototxt:1:7", "end of file"),
        ("a: [1, 2", "1:9", "',' or ']' in a list", "end of file"),
        ("a: 1 }", "1:6", "a field name", "'}'"),
        ('a: "unterminated\n', "1:4", "a field, value or symbol", "unterminated string"),
        ("a: -MAX", "1:5", "a number after '-'", "'MAX'"),
        ("a < x: 1 }", "1:10", "a field name or '>'", "'}'"),
        ("a: 5abc", "1:4", "a field, value or symbol", "'5'"),
    ],
)
def test_errors_carry_file_line_column(text, where, expected, found):
    with pytest.raises(TextFormatError) as info:
        parse(text, filename="f.prototxt")
    assert str(info.value) == f"f.prototxt:{where}: expected {expected}, found {found}"


def test_error_is_a_config_error_and_bad_escape():
    with pytest.raises(ConfigError, match=r"<string>:1:4: expected a valid escape sequence, found '\\q'"):
        parse(r'a: "\q"')


def test_parse_file_uses_path_in_errors(tmp_path):
    path = tmp_path / "bad.prototxt"
    path.write_text("layer {\n  type: }\n")
    with pytest.raises(TextFormatError, match=r"bad\.prototxt:2:9: expected a value"):
        parse_file(path)
    with pytest.raises(ConfigError, match="cannot read Caffe text file"):
        parse_file(tmp_path / "missing.prototxt")


def test_parses_every_example_file(examples):
    for path in sorted(examples.glob("*.prototxt")):
        msg = parse_file(path)
        assert isinstance(msg, Message) and msg.fields, path
    solver = parse_file(examples / "lenet_solver.prototxt")
    assert solver.get("base_lr") == 0.01 and solver.get("lr_policy") == "inv"
    assert solver.get("solver_mode") == "GPU" and isinstance(solver.get("solver_mode"), Identifier)


def _seconds_to_parse(text: str) -> float:
    """The best of three runs (the machine may be busy), whether ``text`` parses or not."""
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        try:
            parse(text)
        except TextFormatError:
            pass
        best = min(best, time.perf_counter() - start)
        if best > 1.0:  # already too slow: no need to wait for the other runs
            break
    return best


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "make",
    [
        lambda n: "a: " + "1" * n + "x",  # a digit run followed by a letter
        lambda n: "a: " + "1" * n + "." + "1" * n + "e",  # digits, '.', digits, an exponent without digits
        lambda n: "a: 1." + "1" * n + "e",
        lambda n: "a: " + "1" * n + "e" + "1" * n + "_",
        lambda n: "a: 0x" + "f" * n + "g",
        lambda n: "a: " + "1" * n + "." * n,
    ],
    ids=[
        "digits-letter",
        "digits-dot-digits-e",
        "one-dot-digits-e",
        "exponent-digits-underscore",
        "hex-digits-letter",
        "digits-dots",
    ],
)
def test_tokenizing_a_long_number_takes_linear_time(make):
    """A number pattern that backtracks over digit runs took quadratic time: 12 s for 16,000 digits."""
    small = _seconds_to_parse(make(20_000))
    assert small < 1.0, f"20,000 characters took {small:.2f} s to tokenize"  # quadratic would be about 20 s
    large = _seconds_to_parse(make(200_000))
    assert large < 3.0, f"200,000 characters took {large:.2f} s to tokenize"
    assert large < 30 * max(small, 1e-3), f"10x the input took {large / small:.0f}x the time: not linear"


def test_long_numbers_keep_their_meaning():
    with pytest.raises(TextFormatError, match="found '1'"):
        parse("a: " + "1" * 50_000 + "x")
    with pytest.raises(TextFormatError, match="does not fit in 64 bits"):
        parse("a: " + "1" * 50_000)
    assert parse("a: 1." + "0" * 50_000 + "e1").get("a") == 10.0
    assert parse("a: " + "0" * 50_000 + "1.5f").get("a") == 1.5
