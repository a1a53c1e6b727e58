"""Exact parsing of Kubernetes resource quantities (the apimachinery grammar).

``<sign>?<digits>(.<digits>)?<suffix>`` where the suffix is a binary SI unit (Ki..Ei), a
decimal SI unit (n, u, m, "", k, M, G, T, P, E) or a decimal exponent (``e3``, ``E-2``).
Values are kept as ``Fraction`` so ``"500m"`` is exactly one half; nothing is rounded here.
"""

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
    """Parse a quantity exactly; accepts the API's string form and plain integers."""
    if isinstance(raw, str) and _is_plain_count(raw):
        return Fraction(_plain_count(raw))
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise QuantityError(f"{raw!r} is not a quantity: {_ALLOWED}")
    value = Fraction(raw) if isinstance(raw, int) else _parse_text(raw)
    if abs(value) > MAX_MAGNITUDE:
        raise _too_large(raw)
    return value


def _too_large(raw: object) -> QuantityError:
    return QuantityError(f"{raw!r} is too large: the largest quantity is {MAX_MAGNITUDE}")


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
        raise QuantityError(f"{raw!r} is negative: use a whole number of 0 or more")
    if value.denominator != 1:
        raise QuantityError(f"{raw!r} is not a whole number: use a whole number such as 1 or 30")
    return int(value)


def format_count(value: int) -> str:
    """The canonical string form of a whole-number quantity, as the API server writes it."""
    return str(value)
