"""Setting variables that name no setting: a misspelt FRACGPU_* variable (in a chart's
extraEnv, say) is otherwise ignored without a word, and the setting keeps its default."""

import difflib
from collections.abc import Collection, Iterable, Mapping


def unknown_variables(
    environ: Mapping[str, str],
    prefix: str,
    known: Collection[str],
    others: Iterable[str] = (),
) -> list[str]:
    """One message per variable that starts with ``prefix`` but is neither ``known`` nor
    under one of ``others`` (prefixes other components read), with the nearest known name."""
    skipped = tuple(others)
    found = []
    for name in sorted(environ):
        if not name.startswith(prefix) or name in known or name.startswith(skipped):
            continue
        near = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        found.append(f"{name} is not a setting{hint}: it is ignored")
    return found
