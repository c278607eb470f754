"""Fuzzing what reads untrusted input: the prototxt parser and the parameter server's wire decoder.

Inputs are generated both as noise and with structure (nested messages, long numbers,
escapes, mutated valid frames). The only outcomes allowed are a result or the documented
error type (``TextFormatError``; ``ProtocolError``) -- no other exception, no hang.

``make test`` runs a quick version; ``make fuzz`` sets ``SPARKDP_FUZZ_EXAMPLES=100000``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sparkdp.caffe.textformat import MAX_DEPTH, TextFormatError, parse
from sparkdp.errors import ProtocolError
from sparkdp.ps.codec import HEADER_SIZE, Limits, Op, decode_from_bytes, encode_to_bytes

from .budget import fuzz_settings, hang_guard

FUZZ = fuzz_settings(1500)
pytestmark = hang_guard(1500)

# ----------------------------------------------------------------- prototxt
_WORDS = st.sampled_from(
    [
        "layer",
        "name",
        "type",
        "bottom",
        "top",
        "param",
        "convolution_param",
        "a",
        "b_2",
        "inf",
        "nan",
        "true",
        "False",
        "-",
    ]
)
_NUMBERS = st.one_of(
    st.integers(min_value=-(1 << 70), max_value=1 << 70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text("0123456789", min_size=1, max_size=6000),
    st.text("0123456789abcdefABCDEF", min_size=1, max_size=40).map(lambda s: "0x" + s),
    st.sampled_from(["1e999999", "1.5f", ".5", "-0", "0x", "1e", "--1"]),
)
# Long digit runs glued to what may not follow a number: a pattern that backtracks over the
# run takes quadratic time on these (seconds at 10,000 digits).  Runs are drawn as a length,
# since Hypothesis does not draw strings that long character by character.
_DIGIT_RUN = st.text("0123456789", min_size=1, max_size=50) | st.builds(
    lambda head, digit, n: head + digit * n,
    st.text("0123456789", max_size=5),
    st.sampled_from("0123456789"),
    st.integers(1, 50_000),
)
_GLUED_NUMBERS = st.one_of(
    st.tuples(_DIGIT_RUN, st.sampled_from("xeEfF_a.Z")).map("".join),
    _DIGIT_RUN.map(lambda s: "1." + s + "e"),
    st.tuples(_DIGIT_RUN, _DIGIT_RUN).map(lambda p: p[0] + "." + p[1] + "ex"),
    st.tuples(_DIGIT_RUN, _DIGIT_RUN).map(lambda p: p[0] + "e" + p[1] + "_"),
    _DIGIT_RUN.map(lambda s: "0x" + s + "fg"),
    st.integers(1, 50_000).map(lambda n: "-" * n + "1"),
    st.integers(1, 50_000).map(lambda n: "1" + "." * n),
)
_STRINGS = st.text(max_size=30).map(lambda s: '"' + s.replace('"', "") + '"') | st.sampled_from(
    ['"\\U00110000"', '"\\xZZ"', '"\\777"', '"\\u12"', '"unterminated', "'single'", '"\\U0010FFFF"']
)
_SYMBOLS = st.sampled_from(["{", "}", "<", ">", ":", "[", "]", ",", ";", "#c\n", "\n", " "])
_TOKENS = st.lists(st.one_of(_WORDS, _NUMBERS, _STRINGS, _SYMBOLS), max_size=60).map(" ".join)
_GLUED = st.tuples(st.sampled_from(["a: ", "a: -", "a: [", "a { b: ", ""]), _GLUED_NUMBERS).map("".join)


def _parse_or_documented_error(text: str) -> None:
    try:
        parse(text)
    except TextFormatError:
        pass


@FUZZ
@given(_TOKENS)
def test_token_soup_parses_or_raises_text_format_error(text):
    _parse_or_documented_error(text)


@FUZZ
@given(_GLUED)
def test_long_numbers_glued_to_letters_parse_or_raise_text_format_error(text):
    _parse_or_documented_error(text)


@FUZZ
@given(st.text(max_size=200))
def test_noise_parses_or_raises_text_format_error(text):
    _parse_or_documented_error(text)


@pytest.mark.parametrize(
    "text",
    [
        "a {" * 5000,
        "a <" * 5000,
        "a: [" + "{" * 5000,
        "a: " + "9" * 5000,
        "a: -" + "9" * 5000,
        "a: 0x" + "f" * 5000,
        'a: "\\U00110000"',
        "a: 18446744073709551616",
        # a digit run followed by what cannot follow a number (these took quadratic time)
        "a: " + "9" * 200_000 + "x",
        "a: 1." + "9" * 200_000 + "e",
        "a: " + "9" * 100_000 + "." + "9" * 100_000 + "e",
        "a: " + "9" * 200_000 + "." * 10,
        "a: " + "-" * 50_000 + "1",
        "a: 0x" + "f" * 200_000 + "g",
    ],
)
def test_crafted_inputs_raise_text_format_error(text):
    with pytest.raises(TextFormatError):
        parse(text)


def test_nesting_up_to_the_limit_still_parses():
    text = "a { " * MAX_DEPTH + "b: 1 " + "} " * MAX_DEPTH
    msg = parse(text)
    for _ in range(MAX_DEPTH):
        msg = msg.get("a")
    assert msg.get("b") == 1
    assert parse("a: 18446744073709551615").get("a") == (1 << 64) - 1


# -------------------------------------------------------------- wire decoder
_LIMITS = Limits()


def _valid_frame(data: st.DataObject) -> bytearray:
    n = data.draw(st.integers(0, 3))
    tensors = [torch.randn(data.draw(st.integers(0, 5))) for _ in range(n)]
    meta = data.draw(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3))
    return encode_to_bytes(
        data.draw(st.sampled_from(list(Op))), data.draw(st.integers(0, 1 << 31)), meta, tensors
    )


def _decode_or_documented_error(frame: bytes | bytearray) -> None:
    try:
        decode_from_bytes(frame, _LIMITS)
    except ProtocolError:
        pass


@FUZZ
@given(st.binary(max_size=300))
def test_noise_frames_raise_protocol_error(frame):
    _decode_or_documented_error(frame)


@FUZZ
@given(st.data())
def test_mutated_valid_frames_decode_or_raise_protocol_error(data):
    frame = _valid_frame(data)
    for _ in range(data.draw(st.integers(1, 4))):
        if not frame:
            break
        i = data.draw(st.integers(0, len(frame) - 1))
        action = data.draw(st.sampled_from(["flip", "cut", "grow", "header"]))
        if action == "flip":
            frame[i] ^= data.draw(st.integers(1, 255))
        elif action == "cut":
            frame = frame[:i]
        elif action == "grow":
            frame += data.draw(st.binary(min_size=1, max_size=50))
        elif len(frame) >= HEADER_SIZE:  # rewrite a header field with an extreme value
            j = data.draw(st.integers(0, HEADER_SIZE - 4))
            frame[j : j + 4] = data.draw(
                st.sampled_from([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x7f\xff\xff\xff"])
            )
    _decode_or_documented_error(frame)


def test_leading_zeros_do_not_count_against_the_64_bits():
    """Found by this fuzzer: a hex literal with 17 zeros escaped as ValueError."""
    assert parse("a: 0x00000000000000000").get("a") == 0
    assert parse("a: 0x" + "0" * 30 + "ff").get("a") == 255
    assert parse("a: " + "0" * 30 + "7").get("a") == 7
