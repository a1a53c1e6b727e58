"""A structural reader of Go templates (text/template as Helm uses it), for chart tests.

It does not render: it splits a template into text and actions, and checks what can be
checked without Helm: every ``{{`` has its ``}}``, comments are closed, strings and
parentheses inside actions are balanced, ``if``/``range``/``with``/``define``/``block`` are
closed by ``end`` (with ``else`` only where Go allows it), and it lists what actions refer to:
``.Values`` paths, ``.Files.Get`` paths, included template names, defined names and the
functions called.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Final

OPEN: Final = "{{"
CLOSE: Final = "}}"
BLOCK_KEYWORDS: Final = frozenset({"if", "range", "with", "define", "block"})
KEYWORDS: Final = BLOCK_KEYWORDS | {"else", "end", "template", "nil", "true", "false", "break"}
# Go text/template builtins, Sprig's functions used by charts, and Helm's own.
FUNCTIONS: Final = frozenset(
    [
        "and",
        "or",
        "not",
        "len",
        "index",
        "slice",
        "print",
        "printf",
        "println",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "call",
        "html",
        "js",
        "urlquery",
        "default",
        "empty",
        "coalesce",
        "ternary",
        "toJson",
        "toYaml",
        "fromYaml",
        "fromJson",
        "fromYamlArray",
        "toPrettyJson",
        "include",
        "tpl",
        "required",
        "fail",
        "lookup",
        "quote",
        "squote",
        "trim",
        "trimSuffix",
        "trimPrefix",
        "trunc",
        "upper",
        "lower",
        "title",
        "replace",
        "contains",
        "hasPrefix",
        "hasSuffix",
        "nindent",
        "indent",
        "join",
        "split",
        "splitList",
        "list",
        "dict",
        "set",
        "unset",
        "get",
        "hasKey",
        "keys",
        "values",
        "append",
        "prepend",
        "concat",
        "first",
        "last",
        "uniq",
        "has",
        "without",
        "merge",
        "mergeOverwrite",
        "deepCopy",
        "int",
        "int64",
        "float64",
        "toString",
        "toStrings",
        "atoi",
        "add",
        "sub",
        "mul",
        "div",
        "mod",
        "max",
        "min",
        "semverCompare",
        "b64enc",
        "b64dec",
        "sha256sum",
        "regexMatch",
        "regexReplaceAll",
        "kindIs",
        "typeOf",
        "until",
        "sortAlpha",
        "pluck",
        "dig",
    ]
)

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.DOTALL)
_TOKEN = re.compile(
    r"""
      (?P<string>"(?:[^"\\\n]|\\.)*")
    | (?P<raw>`[^`]*`)
    | (?P<char>'(?:[^'\\]|\\.)')
    | (?P<number>-?\d+(?:\.\d+)?)
    | (?P<field>\$\w*(?:\.[A-Za-z_]\w*)*|\.?[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)
    | (?P<dot>\.)
    | (?P<assign>:=|=)
    | (?P<op>[|(),])
    | (?P<space>\s+)
    | (?P<bad>.)
    """,
    re.VERBOSE,
)


class TemplateSyntaxError(ValueError):
    """The template is malformed; the message names the file, line and problem."""


@dataclass
class Action:
    line: int
    body: str
    tokens: list[tuple[str, str]] = field(default_factory=list)

    @property
    def keyword(self) -> str:
        for kind, text in self.tokens:
            if kind != "space":
                return text if kind == "field" and text in KEYWORDS else ""
        return ""


@dataclass
class Template:
    name: str
    actions: list[Action]

    def values_paths(self) -> set[tuple[str, ...]]:
        """Every .Values.a.b (or $.Values.a.b) path the template reads."""
        paths = set()
        for action in self.actions:
            for kind, text in action.tokens:
                if kind != "field":
                    continue
                match = re.match(r"^(?:\$)?\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)$", text)
                if match:
                    paths.add(tuple(match.group(1).lstrip(".").split(".")))
        return paths

    def string_arguments_of(self, callee: str) -> list[str]:
        """The string literal right after ``callee`` in each action (e.g. include names)."""
        found = []
        for action in self.actions:
            meaningful = [(k, t) for k, t in action.tokens if k != "space"]
            for (kind, text), (next_kind, next_text) in itertools.pairwise(meaningful):
                if kind == "field" and text.endswith(callee) and next_kind == "string":
                    found.append(next_text[1:-1])
        return found

    def defined_names(self) -> list[str]:
        return [
            t[1][1:-1]
            for a in self.actions
            if a.keyword == "define"
            for t in [[x for x in a.tokens if x[0] != "space"][1]]
        ]

    def functions_called(self) -> set[str]:
        """Bare identifiers in command position: after {{, (, | or a keyword."""
        called = set()
        for action in self.actions:
            meaningful = [(k, t) for k, t in action.tokens if k != "space"]
            previous = "("
            for kind, text in meaningful:
                is_word = kind == "field" and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text)
                if (
                    is_word
                    and text not in KEYWORDS
                    and (previous in ("(", "|", ":=", "=") or previous in BLOCK_KEYWORDS)
                ):
                    called.add(text)
                previous = text
        return called


def _line_of(source: str, offset: int) -> int:
    return source.count("\n", 0, offset) + 1


def parse(name: str, source: str) -> Template:
    """Split into actions and check the structure; raise TemplateSyntaxError on a fault."""
    actions = _actions(name, source)
    _check_blocks(name, actions)
    return Template(name, actions)


def _actions(name: str, source: str) -> list[Action]:
    actions = []
    position = 0
    while True:
        start = source.find(OPEN, position)
        stray = source.find(CLOSE, position, start if start >= 0 else len(source))
        if stray >= 0:
            raise TemplateSyntaxError(
                f"{name}:{_line_of(source, stray)}: '}}}}' without an opening '{{{{'"
            )
        if start < 0:
            return actions
        inner_start = start + 2
        if source.startswith("- ", inner_start):
            inner_start += 2
        if source.startswith("/*", inner_start):
            end_comment = source.find("*/", inner_start + 2)
            if end_comment < 0:
                raise TemplateSyntaxError(
                    f"{name}:{_line_of(source, start)}: comment '/*' is never closed"
                )
            after = end_comment + 2
            rest = source[after:]
            close = after + (len(rest) - len(rest.lstrip(" -")))
            if not source.startswith(CLOSE, close):
                raise TemplateSyntaxError(
                    f"{name}:{_line_of(source, start)}: a comment must end with '*/}}}}'"
                )
            position = close + 2
            continue
        body, end = _action_body(name, source, start, inner_start)
        action = Action(_line_of(source, start), body, _tokenize(name, source, start, body))
        actions.append(action)
        position = end


def _action_body(name: str, source: str, start: int, inner_start: int) -> tuple[str, int]:
    """The text inside one action and the offset after its '}}' (strings may hold braces)."""
    i = inner_start
    quote = ""
    while i < len(source):
        char = source[i]
        if quote:
            if char == "\\" and quote == '"':
                i += 2
                continue
            if char == quote:
                quote = ""
            elif char == "\n" and quote == '"':
                raise TemplateSyntaxError(
                    f"{name}:{_line_of(source, i)}: string not closed before the end of line"
                )
        elif char in "\"`'":
            quote = char
        elif source.startswith(OPEN, i):
            raise TemplateSyntaxError(
                f"{name}:{_line_of(source, start)}: '{{{{' opened inside an action "
                f"that was not closed"
            )
        elif source.startswith(CLOSE, i):
            body = source[inner_start:i]
            if body.endswith(" -"):
                body = body[:-2]
            return body, i + 2
        i += 1
    raise TemplateSyntaxError(f"{name}:{_line_of(source, start)}: '{{{{' is never closed")


def _tokenize(name: str, source: str, start: int, body: str) -> list[tuple[str, str]]:
    tokens = []
    depth = 0
    for match in _TOKEN.finditer(body):
        kind = match.lastgroup or "bad"
        text = match.group()
        if kind == "bad":
            raise TemplateSyntaxError(
                f"{name}:{_line_of(source, start)}: unexpected {text!r} in action {body!r}"
            )
        if text == "(":
            depth += 1
        elif text == ")":
            depth -= 1
            if depth < 0:
                raise TemplateSyntaxError(
                    f"{name}:{_line_of(source, start)}: ')' without '(' in {body!r}"
                )
        tokens.append((kind, text))
    if depth:
        raise TemplateSyntaxError(f"{name}:{_line_of(source, start)}: unbalanced '(' in {body!r}")
    if not any(kind != "space" for kind, _ in tokens):
        raise TemplateSyntaxError(f"{name}:{_line_of(source, start)}: empty action")
    return tokens


def _check_blocks(name: str, actions: list[Action]) -> None:
    stack: list[Action] = []
    for action in actions:
        keyword = action.keyword
        words = [t for k, t in action.tokens if k != "space"]
        if keyword in BLOCK_KEYWORDS:
            if keyword in ("define", "block") and (len(words) < 2 or not words[1].startswith('"')):
                raise TemplateSyntaxError(f"{name}:{action.line}: {keyword} needs a quoted name")
            if keyword in ("if", "range", "with") and len(words) < 2:
                raise TemplateSyntaxError(f"{name}:{action.line}: {keyword} needs an argument")
            stack.append(action)
        elif keyword == "else":
            if not stack or stack[-1].keyword not in ("if", "range", "with"):
                raise TemplateSyntaxError(f"{name}:{action.line}: 'else' outside if/range/with")
        elif keyword == "end":
            if len(words) != 1:
                raise TemplateSyntaxError(f"{name}:{action.line}: 'end' takes no arguments")
            if not stack:
                raise TemplateSyntaxError(f"{name}:{action.line}: 'end' without an open block")
            stack.pop()
        elif keyword == "break" and not any(a.keyword == "range" for a in stack):
            raise TemplateSyntaxError(f"{name}:{action.line}: 'break' outside range")
    if stack:
        unclosed = stack[-1]
        raise TemplateSyntaxError(
            f"{name}:{unclosed.line}: '{unclosed.keyword}' is never closed by 'end'"
        )
