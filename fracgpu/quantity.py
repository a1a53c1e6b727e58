"""Exact parsing of Kubernetes resource quantities (the apimachinery grammar).

``<sign>?<digits>(.<digits>)?<suffix>`` where the suffix is a binary SI unit (Ki..Ei), a
decimal SI unit (n, u, m, "", k, M, G, T, P, E) or a decimal exponent (``e3``, ``E-2``).
Values are kept as ``Fraction`` so ``"500m"`` is exactly one half; nothing is rounded here.
A YAML or JSON number is read as its decimal text, as the API server reads one (``2.0`` is 2).
"""

import math
import re
from fractions import Fraction
from typing import Final

from fracgpu.errors import QuantityError

MAX_QUANTITY_LENGTH: Final = 64
# Kubernetes itself caps quantities near 2^63; anything above is an overflow, not a request.
MAX_MAGNITUDE: Final = Fraction(2**63 - 1)
_MAX_COUNT: Final = 2**63 - 1  # MAX_MAGNITUDE as an int: comparing with a Fraction is slow
MAX_EXPONENT: Final = 30

_BINARY_SI: Final = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_SI: Final = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_GRAMMAR: Final = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<exponent>[eE][+-]?[0-9]+)|(?P<suffix>[KMGTPE]i|[numkMGTPE]?))"
)
_ALLOWED: Final = (
    "use a Kubernetes quantity such as 1, 500m, 2Gi or 1e3 "
    "(suffixes Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or an exponent)"
)


def parse_quantity(raw: object) -> Fraction:
    """Parse a quantity exactly; accepts the API's string form and YAML/JSON numbers."""
    if isinstance(raw, str) and _is_plain_count(raw):
        return Fraction(_plain_count(raw))
    if isinstance(raw, str):
        value = _parse_text(raw)
    elif isinstance(raw, int) and not isinstance(raw, bool):
        value = Fraction(raw)
    elif isinstance(raw, float) and math.isfinite(raw):
        # repr is the shortest text that reads back as this float: what the YAML said, and
        # what kubectl sends for it (0.1 is one tenth, not the binary float next to it).
        value = Fraction(repr(raw))
    else:
        raise QuantityError(f"{_quoted(raw)} is not a quantity: {_ALLOWED}")
    if abs(value) > MAX_MAGNITUDE:
        raise _too_large(raw)
    return value


def shown(raw: object) -> str:
    """A value as the person wrote it (YAML/JSON spelling), at most ``MAX_QUANTITY_LENGTH``
    characters: messages echo what a tenant sent, never all of it."""
    if isinstance(raw, str):
        text = raw
    elif raw is None or isinstance(raw, bool):
        return "null" if raw is None else str(raw).lower()
    elif isinstance(raw, int):
        # Python refuses str() of an int past 4,300 digits; the text is cut at 64 anyway.
        text = str(raw) if raw.bit_length() < 4096 else f"(a {raw.bit_length()}-bit number)"
    elif isinstance(raw, float):
        text = repr(raw)
    else:
        return "(a mapping)" if isinstance(raw, dict) else f"(a {type(raw).__name__})"
    return text if len(text) <= MAX_QUANTITY_LENGTH else text[:MAX_QUANTITY_LENGTH] + "..."


def _quoted(raw: object) -> str:
    return repr(shown(raw)) if isinstance(raw, str) else shown(raw)


def _too_large(raw: object) -> QuantityError:
    return QuantityError(f"{_quoted(raw)} is too large: the largest quantity is {MAX_MAGNITUDE}")


def _parse_text(text: str) -> Fraction:
    if len(text) > MAX_QUANTITY_LENGTH:
        raise QuantityError(f"quantity of {len(text)} characters is too long: {_ALLOWED}")
    match = _GRAMMAR.fullmatch(text)
    if match is None:
        raise QuantityError(f"{text!r} is not a quantity: {_ALLOWED}")
    value = Fraction(match["number"])
    if match["exponent"] is not None:
        exponent = int(match["exponent"][1:])
        if abs(exponent) > MAX_EXPONENT:
            raise QuantityError(f"{text!r} has exponent {exponent}: use -30..30")
        value *= Fraction(10) ** exponent
    elif match["suffix"] in _BINARY_SI:
        value *= _BINARY_SI[match["suffix"]]
    else:
        value *= _DECIMAL_SI[match["suffix"]]
    return -value if match["sign"] == "-" else value


def _is_plain_count(text: str) -> bool:
    """ASCII digits only, no longer than the grammar allows ("10", "4"): a whole number that
    needs neither the grammar nor a Fraction (the usual form of GPU resources)."""
    return text.isascii() and text.isdigit() and len(text) <= MAX_QUANTITY_LENGTH


def _plain_count(text: str) -> int:
    count = int(text)
    if count > _MAX_COUNT:
        raise _too_large(text)
    return count


def parse_count(raw: object) -> int:
    """Parse a quantity that must be a non-negative whole number (GPU resources are counts)."""
    if isinstance(raw, str) and _is_plain_count(raw):
        return _plain_count(raw)
    value = parse_quantity(raw)
    if value < 0:
        raise QuantityError(f"{_quoted(raw)} is negative: use a whole number of 0 or more")
    if value.denominator != 1:
        raise QuantityError(
            f"{_quoted(raw)} is not a whole number: use a whole number such as 1 or 30"
        )
    return int(value)


def format_count(value: int) -> str:
    """The canonical string form of a whole-number quantity, as the API server writes it."""
    return str(value)
