"""Reading the images' Dockerfiles (docker/*.Dockerfile): no container engine runs here, so
tests check what they copy and run against the tree."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCKERFILES = sorted((REPO / "docker").glob("*.Dockerfile"))


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    found = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def copies(path: Path) -> list[tuple[str | None, list[str], str]]:
    """(from-stage or None, sources, destination) of each COPY."""
    found = []
    for keyword, rest in instructions(path):
        if keyword != "COPY":
            continue
        words = rest.split()
        stage = None
        while words[0].startswith("--"):
            option = words.pop(0)
            if option.startswith("--from="):
                stage = option.removeprefix("--from=")
        found.append((stage, words[:-1], words[-1]))
    return found


def sources_copied_into(path: Path, stage: str) -> list[str]:
    """What the build context gives stage ``stage`` (``FROM ... AS <stage>``): the sources
    of its COPYs without --from, as written."""
    current = None
    found: list[str] = []
    for keyword, rest in instructions(path):
        if keyword == "FROM":
            words = rest.split()
            current = words[-1] if len(words) >= 3 and words[-2].upper() == "AS" else None
        elif keyword == "COPY" and current == stage and "--from=" not in rest:
            found.extend(w for w in rest.split()[:-1] if not w.startswith("--"))
    return found
