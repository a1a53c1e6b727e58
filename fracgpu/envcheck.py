"""Setting variables that name no setting: a misspelt FRACGPU_* variable (in a chart's
extraEnv, say) is otherwise ignored without a word, and the setting keeps its default."""

import difflib
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Final

# What kubelet sets for every Service of the pod's namespace (enableServiceLinks): the
# webhook's own Service, fracgpu-webhook, gives FRACGPU_WEBHOOK_SERVICE_HOST and the like.
_SERVICE_LINK: Final = re.compile(
    r".+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)"
)
_SERVICE_URL: Final = re.compile(r"(tcp|udp|sctp)://\S+")


def _service_link(name: str, value: str) -> bool:
    """<SERVICE>_SERVICE_HOST, _SERVICE_PORT[_<port name>], _PORT (a tcp:// URL) and
    _PORT_<n>_<protocol>[_PROTO|_PORT|_ADDR]."""
    if _SERVICE_LINK.fullmatch(name):
        return True
    return name.endswith("_PORT") and _SERVICE_URL.fullmatch(value) is not None


def unknown_variables(
    environ: Mapping[str, str],
    prefix: str,
    known: Collection[str],
    others: Iterable[str] = (),
) -> list[str]:
    """One message per variable that starts with ``prefix`` but is neither ``known``, nor
    under one of ``others`` (prefixes other components read), nor one kubelet sets for a
    Service, with the nearest known name."""
    skipped = tuple(others)
    found = []
    for name in sorted(environ):
        if not name.startswith(prefix) or name in known or name.startswith(skipped):
            continue
        if _service_link(name, environ[name]):
            continue
        near = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        found.append(f"{name} is not a setting{hint}: it is ignored")
    return found
