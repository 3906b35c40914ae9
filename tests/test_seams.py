"""A seam takes a new implementation without a product file changing: a search strategy and a launcher defined
here, in a test module, and registered by one line each, are names the spec accepts, the registries resolve, and
the searcher and the trainable use. Unregistered, the spec refuses the names again."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import optuna
import pytest

from sweeps.launch.launcher import Launcher, launcher_for
from sweeps.search.searcher import BatchSizeSearcher
from sweeps.search.space import hyperparameters_for
from sweeps.search.strategies import SearchStrategy, search_space, strategy_for
from sweeps.spec import LAUNCHER_REGISTRY, STRATEGY_REGISTRY, SpecError, parse_spec
from workloads.api import TrialConfig, TrialRunContext


class LargestFirstStrategy(SearchStrategy):
    """A toy: the largest batch size with trials left goes first, and only the LR multiplier is searched."""

    name = "largest_first"

    def search_space(self) -> dict[str, optuna.distributions.BaseDistribution]:
        return {"lr_multiplier": optuna.distributions.FloatDistribution(0.5, 2.0, log=True)}

    def next_batch_size(self, batch_sizes: Sequence[int], has_trials_left: Callable[[int], bool]) -> int | None:
        return max((b for b in batch_sizes if has_trials_left(b)), default=None)

    def hyperparameters(self, batch_size: int, params: dict[str, Any]) -> dict[str, Any]:
        return hyperparameters_for(self.spec, batch_size, params)


#: what the toy launcher was asked to run: (trial id, batch size in sequences)
RAN: list[tuple[str, int]] = []


class RecordingLauncher(Launcher):
    """A toy: runs no trial, records it."""

    name = "recording"

    def run_trial(self, cfg: TrialConfig, context: TrialRunContext, trials: Any) -> None:
        RAN.append((cfg.trial_id, cfg.batch.batch_size_sequences))


@pytest.fixture
def registered() -> Iterator[None]:
    """The two toys registered, one line each, for the test only."""
    STRATEGY_REGISTRY.register("largest_first", f"{__name__}:LargestFirstStrategy")
    LAUNCHER_REGISTRY.register("recording", f"{__name__}:RecordingLauncher")
    yield
    STRATEGY_REGISTRY.unregister("largest_first")
    LAUNCHER_REGISTRY.unregister("recording")


def _toy_spec(tiny_spec_dict: dict) -> dict:
    d = copy.deepcopy(tiny_spec_dict)
    d["search"].update(strategy="largest_first", batch_sizes_sequences=[4, 8, 16])
    d["resources"] = {**d.get("resources", {}), "launcher": "recording"}
    return d


def test_a_strategy_registered_from_outside_the_product_is_a_name_the_spec_and_the_searcher_take(
    registered, tiny_spec_dict, tmp_path
):
    spec = parse_spec(_toy_spec(tiny_spec_dict))
    assert spec.search.strategy == spec.model_dump()["search"]["strategy"] == "largest_first"
    assert type(strategy_for(spec)) is LargestFirstStrategy
    assert set(search_space(spec)) == {"lr_multiplier"}  # the strategy's own space, space.py untouched
    searcher = BatchSizeSearcher(spec, f"sqlite:///{tmp_path / 'o.db'}", "st")
    assert type(searcher.strategy) is LargestFirstStrategy and set(searcher.space) == {"lr_multiplier"}
    first = searcher.suggest("t0")
    assert isinstance(first, dict) and first["batch_size_sequences"] == 16  # the toy's order, not round-robin
    assert 0.5 <= first["lr_multiplier"] <= 2.0
    assert list(STRATEGY_REGISTRY)[-1] == "largest_first"
    assert "largest_first" in spec.model_json_schema()["$defs"]["SearchSpec"]["properties"]["strategy"]["enum"]


def test_a_launcher_registered_from_outside_the_product_runs_the_trials(registered, tiny_spec_dict, monkeypatch):
    import ray.tune

    from sweeps.launch import trainable
    from sweeps.launch.workload import workload_config

    spec = parse_spec(_toy_spec(tiny_spec_dict))
    launcher = launcher_for(spec)
    assert type(launcher) is RecordingLauncher and spec.resources.launcher == "recording"
    trials = trainable.SweepTrials(
        spec_json=spec.model_dump_json(), workload=workload_config(spec), storage_path="/st", launcher=launcher.name
    )

    class _Context:
        def get_trial_id(self) -> str:
            return "trial-7"

    monkeypatch.setattr(ray.tune, "get_context", lambda: _Context())
    RAN.clear()
    config = {"batch_size_sequences": 8, "seed": 0, "lr": 1e-3, "lr_rule": "sqrt", "beta2": 0.99}
    trainable.run_trial({**config, "beta2_half_life_tokens": 4096.0}, trials)
    assert RAN == [("trial-7", 8)]


def test_unregistered_the_names_are_refused_again(tiny_spec_dict):
    with pytest.raises(SpecError, match="search.strategy.*Input should be 'independent' or 'transfer'"):
        parse_spec(_toy_spec(tiny_spec_dict))
    d = _toy_spec(tiny_spec_dict)
    d["search"]["strategy"] = "independent"
    with pytest.raises(SpecError, match="resources.launcher.*Input should be 'trial_runners' or 'train_run_per_trial'"):
        parse_spec(d)


def test_a_registry_refuses_a_second_entry_of_a_name_and_a_target_without_its_attribute():
    from sweeps.errors import InvalidInput

    with pytest.raises(InvalidInput, match="'transfer' is already registered"):
        STRATEGY_REGISTRY.register("transfer", f"{__name__}:LargestFirstStrategy")
    with pytest.raises(InvalidInput, match="is not 'module.path:Attribute'"):
        LAUNCHER_REGISTRY.register("recording", __name__)
    assert list(STRATEGY_REGISTRY) == ["independent", "transfer"]
    assert list(LAUNCHER_REGISTRY) == ["trial_runners", "train_run_per_trial"]
