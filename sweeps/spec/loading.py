"""Reading a sweep spec: YAML or JSON text or files, a ``base:`` chain deep-merged, every invalid field
reported by its dotted path (``search.batch_sizes_sequences.2``) in one :class:`SpecError`, with the
value it got, a close field name for an unknown one, and the file, line and column of a YAML error
(:mod:`sweeps.spec._errors`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sweeps.errors import InvalidInput
from sweeps.spec._errors import describe_errors, describe_yaml_error
from sweeps.spec.sweep import SweepSpec, deep_merge, with_stored_defaults

__all__ = [
    "SpecError",
    "load_spec",
    "load_stored_spec",
    "parse_spec",
    "parse_spec_text",
    "parse_stored_spec",
    "read_spec_text",
    "resolved_spec_dict",
    "spec_errors",
]


class SpecError(InvalidInput):
    """A sweep spec is invalid: invalid input (the command line exits 2, the REST service answers 422
    with :attr:`errors`); a ``ValueError`` too, through :class:`~sweeps.errors.InvalidInput`.

    Its text is what the command line prints after ``error:``: one problem in one line (the message
    alone for a file-level one, ``invalid sweep spec: PATH: MESSAGE`` for a field), several as a
    count and one indented ``PATH: MESSAGE`` line each.

    Attributes:
        errors: one ``(path, message)`` pair per invalid field; ``path`` is dotted
            (``search.batch_sizes_sequences.2``), or ``<root>`` for file-level problems.
    """

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        if len(errors) == 1:
            path, msg = errors[0]
            text = msg if path == "<root>" else f"invalid sweep spec: {path}: {msg}"
        else:
            lines = "\n".join(f"  {p}: {m}" for p, m in errors)
            text = f"invalid sweep spec ({len(errors)} errors):\n{lines}"
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, tuple[list[tuple[str, str]]]]:
        return SpecError, (self.errors,)


def spec_errors(exc: ValidationError) -> list[tuple[str, str]]:
    """Turn a pydantic ``ValidationError`` of a :class:`SweepSpec` into ``(dotted path, message)``
    pairs (:func:`sweeps.spec._errors.describe_errors`)."""
    return describe_errors(exc, SweepSpec)


def parse_spec(data: Any) -> SweepSpec:
    """Validate a parsed spec (a mapping).

    Raises:
        SpecError: with every invalid field's path.
    """
    if not isinstance(data, dict):
        raise SpecError([("<root>", f"a sweep spec must be a mapping, got {type(data).__name__}")])
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(spec_errors(exc)) from None


def parse_stored_spec(data: Any) -> SweepSpec:
    """:func:`parse_spec` for a spec a sweep wrote itself (``OUT/spec.yaml``): the defaults of the version that
    wrote it apply where the file leaves a field out (:func:`sweeps.spec.sweep.with_stored_defaults`).

    Raises:
        SpecError: with every invalid field's path.
    """
    return parse_spec(with_stored_defaults(data))


def load_stored_spec(path: str | Path) -> SweepSpec:
    """Read a sweep's own ``spec.yaml`` (:func:`parse_stored_spec`).

    Raises:
        SpecError: the file is missing, not YAML, or invalid.
    """
    return parse_stored_spec(_read_yaml_with_base(Path(path)))


def read_spec_text(path: str | Path) -> str:
    """The text of a spec file.

    Raises:
        SpecError: the file is missing or unreadable (not UTF-8).
    """
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError([("<root>", f"spec file not found: {p}")]) from None
    except IsADirectoryError:
        raise SpecError([("<root>", f"spec file {p} is a folder, not a file")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([("<root>", f"cannot read spec file {p}: {exc}")]) from None


def _read_yaml_with_base(p: Path, seen: tuple[Path, ...] = ()) -> Any:
    text = read_spec_text(p)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError([("<root>", describe_yaml_error(exc, text, str(p)))]) from None
    if isinstance(data, dict) and "base" in data:
        ref = data.pop("base")
        if not isinstance(ref, str):
            raise SpecError([("base", "must be the path of another spec file")])
        bp = (p.parent / ref).resolve()
        if bp in seen:
            raise SpecError([("base", f"circular base: {bp}")])
        base = _read_yaml_with_base(bp, seen + (p.resolve(),))
        if not isinstance(base, dict):
            raise SpecError([("base", f"{ref} is not a mapping")])
        data = deep_merge(base, data)
    return data


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a YAML (or JSON) sweep spec file.

    A spec may derive from another: ``base: other.yaml`` (relative to the spec's folder) loads that
    spec first and deep-merges this file's fields over it, so variants do not copy and drift.

    Raises:
        SpecError: the file (or its base) is missing, is not YAML, or has invalid fields (each
            named by path).
    """
    return parse_spec(_read_yaml_with_base(Path(path)))


def resolved_spec_dict(path: str | Path) -> dict:
    """The spec file's content with its ``base`` chain merged (what :func:`load_spec` validates)."""
    data = _read_yaml_with_base(Path(path))
    if not isinstance(data, dict):
        raise SpecError([("<root>", f"a sweep spec must be a mapping, got {type(data).__name__}")])
    return data


def parse_spec_text(text: str) -> SweepSpec:
    """Validate a spec given as YAML or JSON text.

    Raises:
        SpecError: not YAML, or invalid fields.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError([("<root>", describe_yaml_error(exc, text))]) from None
    return parse_spec(data)
