"""Readable spec errors: pydantic's error dicts as ``(dotted path, message)`` pairs, each with the bad
value it got and, for an unknown field, the closest field name of its section (from the model's
fields); YAML syntax errors as one line naming the source, line and column. Used by
:mod:`sweeps.spec.loading` and by the arms check of :mod:`sweeps.spec.sweep`.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

__all__ = ["describe_errors", "describe_yaml_error", "format_loc"]

#: the longest shown bad value (its repr), before it is cut
_MAX_VALUE_CHARS = 60


def format_loc(loc: tuple[Any, ...]) -> str:
    """A pydantic ``loc`` as a dotted path (``search.batch_sizes_sequences.2``), ``<root>`` if empty."""
    parts = []
    for p in loc:
        if isinstance(p, str) and p.startswith("function-"):
            continue
        text = str(p)
        # keys that would make the dotted path ambiguous are quoted
        parts.append(text if text and "." not in text and not text.isspace() else repr(text))
    return ".".join(parts) if parts else "<root>"


def _candidates(tp: Any) -> list[Any]:
    """``tp`` without ``Annotated`` and with a union split into its members (``None`` dropped)."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _candidates(typing.get_args(tp)[0])
    if origin is typing.Union or origin is types.UnionType:
        return [c for a in typing.get_args(tp) if a is not type(None) for c in _candidates(a)]
    return [tp]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _field_names(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names of the section at ``loc`` (a path into ``model``); empty if it is no model."""
    current: list[Any] = [model]
    for part in loc:
        if isinstance(part, str) and part.startswith("function-"):
            continue
        nxt: list[Any] = []
        for tp in (c for t in current for c in _candidates(t)):
            if _is_model(tp):
                if isinstance(part, str) and part in tp.model_fields:
                    nxt.append(tp.model_fields[part].annotation)
                continue
            origin, args = typing.get_origin(tp), typing.get_args(tp)
            if isinstance(origin, type) and issubclass(origin, Mapping) and len(args) == 2:
                nxt.append(args[1])
            elif (
                isinstance(origin, type)
                and issubclass(origin, Sequence)
                and not issubclass(origin, str)
                and isinstance(part, int)
                and args
            ):
                nxt.append(args[0])
        current = nxt
    names = {n for t in current for tp in _candidates(t) if _is_model(tp) for n in tp.model_fields}
    return sorted(names)


def _value_text(value: Any) -> str:
    """The value as the spec would write it: ``true``/``false``/``null`` as in YAML, else its repr."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    text = repr(value)
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 3] + "..."


def _with_value(msg: str, error: Mapping[str, Any]) -> str:
    """``msg`` and the value that failed (``, got 'lots'``), unless the message shows it already or the
    value is a whole section (a mapping)."""
    if "input" not in error or error["type"] == "missing":
        return msg
    value = error["input"]
    if isinstance(value, (Mapping, BaseModel)):
        return msg
    if repr(value) in msg or "got " in msg:
        return msg
    return f"{msg.rstrip('.')}, got {_value_text(value)}"


def describe_errors(exc: ValidationError, model: type[BaseModel]) -> list[tuple[str, str]]:
    """``(dotted path, message)`` for each error of validating ``model``.

    An unknown field is said so, with the closest field name of its section (``did you mean
    `budget_tokens`?``) or else the section's fields; a misspelt required field is one error, not an
    unknown field and a missing one. Every other message ends with the value it got.
    """
    errors = exc.errors()
    missing = {tuple(e["loc"]) for e in errors if e["type"] == "missing"}
    suggestions: dict[int, tuple[str, list[str]]] = {}
    merged: set[tuple[Any, ...]] = set()
    for i, e in enumerate(errors):
        loc = tuple(e["loc"])
        if e["type"] != "extra_forbidden" or not loc or not isinstance(loc[-1], str):
            continue
        allowed = _field_names(model, loc[:-1])
        close = difflib.get_close_matches(loc[-1], allowed, n=1, cutoff=0.6)
        suggestions[i] = (close[0] if close else "", allowed)
        if close and loc[:-1] + (close[0],) in missing:
            merged.add(loc[:-1] + (close[0],))
    out = []
    for i, e in enumerate(errors):
        loc = tuple(e["loc"])
        if e["type"] == "missing" and loc in merged:
            continue  # said by the misspelt field's "did you mean"
        if i in suggestions:
            close, allowed = suggestions[i]
            if close:
                required = ", which is required" if loc[:-1] + (close,) in merged else ""
                msg = f"unknown field; did you mean `{close}`{required}?"
            elif allowed:
                section = format_loc(loc[:-1])
                where = "a sweep spec" if section == "<root>" else section
                msg = f"unknown field; {where} takes {', '.join(allowed)}"
            else:
                msg = "unknown field"
        else:
            msg = _with_value(e["msg"].removeprefix("Value error, "), e)
        out.append((format_loc(loc), msg))
    return out


def describe_yaml_error(exc: yaml.YAMLError, text: str, source: str | None = None) -> str:
    """A YAML syntax error in one line: ``not valid YAML in SOURCE at line L, column C: PROBLEM``
    (lines and columns from 1; ``source`` is the file, or None for text given directly)."""
    where = f" in {source}" if source else ""
    mark = (exc.problem_mark or exc.context_mark) if isinstance(exc, yaml.MarkedYAMLError) else None
    if isinstance(exc, yaml.MarkedYAMLError) and mark is not None:
        problem = exc.problem or exc.context or "syntax error"
        line = f"not valid YAML{where} at line {mark.line + 1}, column {mark.column + 1}: {problem}"
        cm = exc.context_mark
        if exc.context and exc.problem and cm is not None:
            same = (cm.line, cm.column) == (mark.line, mark.column)
            line += f" ({exc.context}" + ("" if same else f" at line {cm.line + 1}, column {cm.column + 1}") + ")"
    elif isinstance(exc, yaml.reader.ReaderError):
        pos = exc.position
        line_no, col = text.count("\n", 0, pos) + 1, pos - (text.rfind("\n", 0, pos) + 1) + 1
        char = exc.character
        if isinstance(char, int):  # a code point (text) or a byte (bytes)
            what = f"character #x{char:04x}" if exc.encoding == "unicode" else f"byte #x{char:02x}"
        else:
            what = f"character {char!r}"
        line = f"not valid YAML{where} at line {line_no}, column {col}: unacceptable {what} ({exc.reason})"
    else:
        line = f"not valid YAML{where}: " + str(exc).replace('"<unicode string>"', source or "the text")
    return " ".join(line.split())
