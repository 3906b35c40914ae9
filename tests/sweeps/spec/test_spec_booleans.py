"""Every boolean of a sweep spec is strict: ``true``/``false`` only, never ``"yes"``, ``"on"``, ``"1"`` or ``1``
(pydantic's lax mode reads all of those as a boolean; a spec flag that turned on from a string was a silent
surprise). The check walks the whole spec model, so a flag added later is held to it too."""

from __future__ import annotations

import copy
import types
import typing

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from critbatch.main import app
from sweeps.spec import SpecError, SweepSpec, parse_spec
from tests.conftest import write_spec


def _members(tp: typing.Any) -> list[typing.Any]:
    """``tp`` without ``Annotated``, with unions and containers opened to their members."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _members(typing.get_args(tp)[0])
    if origin is not None and (origin in (typing.Union, types.UnionType) or isinstance(origin, type)):
        return [m for a in typing.get_args(tp) for m in _members(a)]
    return [tp]


def bool_fields(model: type[BaseModel], prefix: str = "") -> dict[str, bool]:
    """``{dotted path: strict?}`` of every ``bool`` field reachable from ``model``."""
    out: dict[str, bool] = {}
    for name, f in model.model_fields.items():
        for tp in _members(f.annotation):
            if tp is bool:
                out[prefix + name] = any(getattr(m, "strict", None) for m in f.metadata)
            elif isinstance(tp, type) and issubclass(tp, BaseModel):
                out.update(bool_fields(tp, f"{prefix}{name}."))
    return out


#: where each flag sits in a spec built from the tiny one (its section's other required fields given)
_SECTIONS = {
    "model.tie_word_embeddings": {},
    "eval.allow_folded_milestones": {},
    "noise_scale.enabled": {},
    "pruning.enabled": {},
    "resources.compile": {},
    "resources.activation_checkpointing": {},
    "search.precision.reallocate_tokens": {"b_crit_ratio": 3},
    "finetune.truncate": {"checkpoint_dir": "out/tiny-checkpoint"},
}


def test_every_boolean_of_the_spec_is_strict_and_listed_here():
    found = bool_fields(SweepSpec)
    assert set(found) == set(_SECTIONS), "a new spec flag: add it to _SECTIONS"
    assert [p for p, strict in found.items() if not strict] == []


def _with_flag(tiny: dict, path: str, value: object) -> dict:
    d = copy.deepcopy(tiny)
    if path.startswith("finetune."):
        d["workload"] = "finetune"
    *parents, leaf = path.split(".")
    section = d
    for i, key in enumerate(parents):
        section = section.setdefault(key, {} if i < len(parents) - 1 else dict(_SECTIONS[path]))
    section[leaf] = value
    return d


@pytest.mark.parametrize("path", sorted(_SECTIONS))
@pytest.mark.parametrize("value", ["yes", "on", "1", "true", 1, 0])
def test_a_flag_given_as_a_string_or_a_number_is_refused_naming_it(tiny_spec_dict, path, value):
    with pytest.raises(SpecError) as e:
        parse_spec(_with_flag(tiny_spec_dict, path, value))
    assert path in dict(e.value.errors), e.value.errors
    assert "valid boolean" in dict(e.value.errors)[path]


@pytest.mark.parametrize("path", sorted(_SECTIONS))
def test_a_real_boolean_is_still_read(tiny_spec_dict, path):
    s = parse_spec(_with_flag(tiny_spec_dict, path, True))
    value = s
    for key in path.split("."):
        value = getattr(value, key)
    assert value is True


def test_validate_exits_2_on_reallocate_tokens_yes(tmp_path, tiny_spec_dict):
    bad = write_spec(tmp_path, _with_flag(tiny_spec_dict, "search.precision.reallocate_tokens", "yes"))
    r = CliRunner().invoke(app, ["validate", str(bad)])
    assert r.exit_code == 2, r.output
    assert "search.precision.reallocate_tokens" in r.output and "'yes'" in r.output, r.output
