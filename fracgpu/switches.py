"""The words an on/off setting takes, for every component's flags and variables alike."""

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

SWITCH_WORDS: Final[Mapping[str, bool]] = MappingProxyType(
    {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
)


def switch_value(text: str) -> bool | None:
    """``text`` as an on/off value (any case), or None when it is not one of SWITCH_WORDS."""
    return SWITCH_WORDS.get(text.lower())
