import re
from collections.abc import Callable
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fracgpu import quantity
from fracgpu.errors import QuantityError
from fracgpu.quantity import format_count, parse_count, parse_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", Fraction(1)),
        ("3000", Fraction(3000)),
        ("500m", Fraction(1, 2)),
        ("2Gi", Fraction(2 * 2**30)),
        ("1Ki", Fraction(1024)),
        ("1k", Fraction(1000)),
        ("1.5", Fraction(3, 2)),
        (".5", Fraction(1, 2)),
        ("5.", Fraction(5)),
        ("+7", Fraction(7)),
        ("-1", Fraction(-1)),
        ("1e3", Fraction(1000)),
        ("1E-2", Fraction(1, 100)),
        ("100n", Fraction(1, 10**7)),
        ("2u", Fraction(2, 10**6)),
        ("1M", Fraction(10**6)),
        ("1Ei", Fraction(2**60)),
        (12, Fraction(12)),
    ],
)
def test_parses_exactly(text: object, expected: Fraction) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("", "is not a quantity"),
        ("abc", "is not a quantity"),
        ("NaN", "is not a quantity"),
        ("Infinity", "is not a quantity"),
        ("inf", "is not a quantity"),
        ("1.2.3", "is not a quantity"),
        ("1Xi", "is not a quantity"),
        ("1 ", "is not a quantity"),
        (" 1", "is not a quantity"),
        ("0x10", "is not a quantity"),
        ("1e400", "has exponent 400"),
        ("99999999999999999999", "is too large"),
        ("9Ei", "is too large"),
        ("1" * 65, "is too long"),
        (float("nan"), "nan is not a quantity"),
        (float("inf"), "inf is not a quantity"),
        (1e300, "is too large"),
        (True, "is not a quantity"),
        (None, "is not a quantity"),
        ([1], "is not a quantity"),
    ],
)
def test_rejects_with_a_message(raw: object, fragment: str) -> None:
    with pytest.raises(QuantityError, match=fragment) as info:
        parse_quantity(raw)
    assert "use" in str(info.value) or "largest" in str(info.value)


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [("-1", "is negative"), ("500m", "is not a whole number"), ("1.5", "is not a whole number")],
)
def test_count_rejects_negative_and_fractional(raw: str, fragment: str) -> None:
    with pytest.raises(QuantityError, match=fragment):
        parse_count(raw)


def test_yaml_numbers_read_as_their_decimal_text() -> None:
    # As the API server reads what kubectl sends for an unquoted YAML number.
    assert parse_quantity(2.0) == 2
    assert parse_quantity(0.1) == Fraction(1, 10)
    assert parse_count(30.0) == 30
    with pytest.raises(QuantityError, match=r"^2\.5 is not a whole number"):
        parse_count(2.5)


def test_messages_echo_a_bounded_part_of_the_value() -> None:
    for raw, echo in (
        ([1] * 10_000, "(a list)"),
        ({"a": 1}, "(a mapping)"),
        (None, "null"),
        (True, "true"),
        (10**10_000, "(a 33220-bit number)"),
    ):
        with pytest.raises(
            QuantityError, match=rf"^{re.escape(echo)} is (not a quantity|too large)"
        ):
            parse_quantity(raw)
    assert quantity.shown("x" * 1000) == "x" * 64 + "..."
    assert quantity.shown(10**70) == "1" + "0" * 63 + "..."


def test_count_accepts_exact_whole_numbers_in_any_notation() -> None:
    assert parse_count("1000m") == 1
    assert parse_count("1e2") == 100
    assert parse_count("1Ki") == 1024


@given(st.integers(min_value=0, max_value=2**62))
def test_count_round_trips_through_canonical_text(value: int) -> None:
    assert parse_count(format_count(value)) == value


@given(st.text(max_size=40))
def test_arbitrary_text_never_crashes(text: str) -> None:
    try:
        parse_quantity(text)
    except QuantityError as error:
        assert str(error)


@given(st.text(alphabet="0123456789", min_size=1, max_size=70) | st.text(max_size=8))
def test_plain_digits_parse_like_the_grammar(text: str) -> None:
    """Whole numbers in plain digits skip the grammar: same value, same refusals."""

    def outcome(parse: Callable[[str], object]) -> object:
        try:
            return parse(text)
        except QuantityError as error:
            return str(error)

    assert outcome(parse_quantity) == outcome(grammar_only)
    expected = outcome(grammar_only)
    if isinstance(expected, Fraction) and expected >= 0 and expected.denominator == 1:
        assert outcome(parse_count) == int(expected)


def grammar_only(text: str) -> Fraction:
    value = quantity._parse_text(text)
    if abs(value) > quantity.MAX_MAGNITUDE:
        raise quantity._too_large(text)
    return value
