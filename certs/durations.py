"""Durations (`1h30m`, `365d`) and renewal windows (`30%` of a lifetime, or a duration)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

from .errors import SettingsError

_DURATION_PART = re.compile(r"(\d+)(y|w|d|h|m|s)")
_UNIT = {
    "y": timedelta(days=365),
    "w": timedelta(weeks=1),
    "d": timedelta(days=1),
    "h": timedelta(hours=1),
    "m": timedelta(minutes=1),
    "s": timedelta(seconds=1),
}
_DURATION_HELP = "allowed: numbers with units y, w, d, h, m, s, e.g. 365d, 1h30m"


def parse_duration(text: str, what: str = "duration") -> timedelta:
    """`1h30m`, `365d`, `10y` (a year is 365 days) as a timedelta."""
    compact = text.strip().lower()
    if not compact or _DURATION_PART.sub("", compact):
        raise SettingsError(f"{what}={text!r} is not a duration: {_DURATION_HELP}")
    return sum((int(n) * _UNIT[unit] for n, unit in _DURATION_PART.findall(compact)), timedelta(0))


def format_duration(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


@dataclass(frozen=True)
class Window:
    """How long before expiry a certificate is replaced: a share of its lifetime or a span."""

    fraction: float | None = None
    span: timedelta | None = None

    def __post_init__(self) -> None:
        if (self.fraction is None) == (self.span is None):
            raise SettingsError("a renewal window is either a percentage or a duration, not both")
        if self.fraction is not None and not 0 < self.fraction < 1:
            raise SettingsError(
                f"renewal window {self.fraction:.0%} is not allowed: use 1%..99% of the lifetime"
            )
        if self.span is not None and self.span <= timedelta(0):
            raise SettingsError(f"renewal window {self.span} must be positive")

    @classmethod
    def parse(cls, text: str, what: str = "renewal window") -> Window:
        """`30%` (of each certificate's lifetime) or a duration such as `30d`."""
        stripped = text.strip()
        if stripped.endswith("%"):
            try:
                percent = float(stripped[:-1])
            except ValueError:
                raise SettingsError(
                    f"{what}={text!r} is not a percentage: allowed e.g. 30%"
                ) from None
            return cls(fraction=percent / 100)
        return cls(span=parse_duration(stripped, what))

    def before_expiry(self, lifetime: timedelta) -> timedelta:
        """The span before notAfter from which a certificate of this lifetime is replaced."""
        if self.fraction is not None:
            return lifetime * self.fraction
        assert self.span is not None
        return self.span

    def __str__(self) -> str:
        if self.fraction is not None:
            return f"{self.fraction * 100:g}%"
        assert self.span is not None
        return format_duration(self.span)
