"""Each list of names the spec accepts has one owner, and what the names select agrees with it: the search
strategies (``search.strategy``), the workloads (``workload``) and the LR scaling rules (``search.lr_rules``).
A name added on one side only fails here."""

from __future__ import annotations

import typing

import pytest

from sweeps.spec import LAUNCHER_REGISTRY, STRATEGY_REGISTRY, SearchSpec, SweepSpec
from workloads.api import LR_RULES, WORKLOAD_NAMES


def _allowed(model: type, field: str) -> set[str]:
    """The values a spec field's ``Literal`` type allows (inside ``list[...]`` or ``... | None`` too)."""

    def literals(tp: typing.Any) -> set[str]:
        if typing.get_origin(tp) is typing.Literal:
            return set(typing.get_args(tp))
        return set().union(*(literals(a) for a in typing.get_args(tp))) if typing.get_args(tp) else set()

    return literals(model.model_fields[field].annotation)


def _schema_enum(model: type, field: str) -> list[str]:
    """The names a spec field's JSON schema lists (``enum``, inside ``anyOf`` for an optional field)."""
    prop = model.model_json_schema()["properties"][field]
    return next(s["enum"] for s in prop.get("anyOf", [prop]) if "enum" in s)


def _accepts(model: type, field: str, names) -> bool:
    """Whether ``model`` accepts each of ``names`` as ``field`` (and refuses a name no registry has)."""
    from pydantic import create_model

    info = model.model_fields[field]
    probe = create_model("Probe", value=(info.annotation, info))  # the field alone, its validation as the spec's
    ok = all(getattr(probe.model_validate({"value": n}), "value") == n for n in names)
    with pytest.raises(ValueError, match="Input should be"):
        probe.model_validate({"value": "no-such-name"})
    return ok


def test_the_strategy_registry_owns_the_spec_names():
    """``search.strategy``'s names are the registry's: the spec accepts each, its schema lists them, and each
    resolves to a strategy class of that name."""
    from sweeps.search.strategies import STRATEGIES, SearchStrategy

    assert STRATEGIES is STRATEGY_REGISTRY
    assert list(STRATEGY_REGISTRY) == ["independent", "transfer"] == _schema_enum(SearchSpec, "strategy")
    assert _accepts(SearchSpec, "strategy", STRATEGY_REGISTRY)
    assert all(issubclass(cls, SearchStrategy) and cls.name == name for name, cls in STRATEGIES.items())


def test_an_unknown_strategy_is_refused_naming_the_known_ones():
    from sweeps.errors import InvalidInput
    from sweeps.search.strategies import strategy_for

    with pytest.raises(InvalidInput, match=r"'bayes' is not one of \['independent', 'transfer'\]"):
        strategy_for(typing.cast(SweepSpec, None), "bayes")  # the name is checked before the spec is read


def test_the_workload_registry_and_the_spec_name_the_same_workloads():
    from workloads.registry import _entries

    assert set(_entries()) == set(WORKLOAD_NAMES) == _allowed(SweepSpec, "workload")


def test_every_lr_rule_the_spec_allows_has_an_exponent():
    from workloads.train.scaling import LR_RULE_EXPONENTS

    assert set(LR_RULE_EXPONENTS) == set(LR_RULES) == _allowed(SearchSpec, "lr_rules")


def test_the_launchers_and_the_spec_name_the_same_launchers(tiny_spec_dict):
    """``resources.launcher`` chooses how trials are launched, from the launcher registry's names; unset, it
    leaves the spec's dump (and so every fingerprint) as before it existed, and the driver's
    CRITBATCH_TRIAL_RUNNERS decides."""
    from sweeps.launch.launcher import LAUNCHERS, Launcher, launcher_for
    from sweeps.settings import Settings
    from sweeps.spec.sections import ResourcesSpec

    def use_trial_runners(spec, settings=None):
        return launcher_for(spec, settings).name == "trial_runners"

    assert LAUNCHERS is LAUNCHER_REGISTRY
    assert list(LAUNCHERS) == ["trial_runners", "train_run_per_trial"] == _schema_enum(ResourcesSpec, "launcher")
    assert _accepts(ResourcesSpec, "launcher", LAUNCHERS)
    assert all(issubclass(cls, Launcher) and cls.name == name for name, cls in LAUNCHERS.items())
    unset = SweepSpec.model_validate(tiny_spec_dict)
    assert "launcher" not in unset.model_dump()["resources"]
    per_trial = SweepSpec.model_validate({**tiny_spec_dict, "resources": {"launcher": "train_run_per_trial"}})
    assert per_trial.fingerprint() != unset.fingerprint()
    env_off = Settings(trial_runners=False)
    assert use_trial_runners(unset) and not use_trial_runners(unset, env_off)
    assert not use_trial_runners(per_trial)
    runners = SweepSpec.model_validate({**tiny_spec_dict, "resources": {"launcher": "trial_runners"}})
    assert use_trial_runners(runners, env_off)  # the spec's choice over the environment's
