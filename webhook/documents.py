"""Reading one YAML or JSON document that a person wrote (a pod manifest, a cluster file).

A mistake in it is reported on one line: the file, the line and column, and what is wrong,
never a parser traceback.
"""

import json
from pathlib import Path
from typing import Any, Final

import yaml

from fracgpu.errors import FracgpuError

# A hand-written manifest or cluster file is far smaller; a larger one is a mistake.
MAX_DOCUMENT_BYTES: Final = 32 * 2**20
# What kubectl requires of a pod manifest; without it a cluster file would pass for a pod.
POD_TYPE: Final = {"apiVersion": "v1", "kind": "Pod"}
# apiVersion and kind are quoted this far in a message (a real one is far shorter).
_SHOWN_CHARS: Final = 64


class DocumentError(FracgpuError):
    """The file cannot be read or is not one YAML/JSON document; one line that says why."""


def load(path: Path) -> Any:
    try:
        size = path.stat().st_size
        if size > MAX_DOCUMENT_BYTES:
            raise DocumentError(
                f"{path}: {size} bytes is too large: at most {MAX_DOCUMENT_BYTES // 2**20} MiB"
            )
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DocumentError(f"{path}: not UTF-8 text (byte {error.start})") from None
    except OSError as error:
        raise DocumentError(f"{path}: cannot read it ({error.strerror or error})") from None
    return parse(text, str(path), as_json=path.suffix.lower() == ".json")


def load_pod(path: Path) -> dict[str, Any]:
    """The pod manifest in ``path``: one mapping with apiVersion v1 and kind Pod."""
    return as_pod(load(path), path)


def as_pod(pod: Any, path: Path, *, also: str = "") -> dict[str, Any]:
    """``pod`` (read from ``path``) if it is a Pod manifest (``also``: what else the caller
    takes, named in the message)."""
    wanted = "write one mapping with apiVersion: v1 and kind: Pod" + (f", {also}" if also else "")
    if not isinstance(pod, dict):
        raise DocumentError(f"{path}: not a Pod manifest (a {type(pod).__name__}): {wanted}")
    found = {key: pod.get(key) for key in POD_TYPE}
    if found != POD_TYPE:
        got = ", ".join(
            f"no {key}" if value is None else f"{key} {_shown(value)}"
            for key, value in found.items()
        )
        raise DocumentError(f"{path}: not a Pod manifest ({got}): {wanted}")
    return pod


def _shown(value: object) -> str:
    if not isinstance(value, str):
        return f"of type {type(value).__name__}"
    return repr(value[:_SHOWN_CHARS]) + ("..." if len(value) > _SHOWN_CHARS else "")


def parse(text: str, source: str, *, as_json: bool = False) -> Any:
    """The document in ``text``; JSON when ``as_json`` or when it starts with ``{``."""
    if as_json or text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise DocumentError(
                f"{source}:{error.lineno}:{error.colno}: not valid JSON: {error.msg}"
            ) from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as error:
        raise DocumentError(_yaml_message(source, error)) from None
    except yaml.YAMLError as error:
        raise DocumentError(f"{source}: not valid YAML: {_one_line(str(error))}") from None


def _yaml_message(source: str, error: yaml.MarkedYAMLError) -> str:
    mark = error.problem_mark or error.context_mark
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
    problem = error.problem or "unreadable"
    if error.context:
        problem = f"{problem} ({error.context})"
    return f"{where}: not valid YAML: {_one_line(problem)}"


def _one_line(text: str) -> str:
    return " ".join(text.split())
