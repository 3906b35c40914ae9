"""The searcher composes a search strategy (``search.strategy``, :mod:`sweeps.search.strategies`) and a wave
policy (:class:`sweeps.search.waves.PrecisionWaves`); a searcher saved with the older layout (the strategy a
``transfer`` flag, the waves the searcher's own attributes) goes on as the composed one."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest

from sweeps.search.searcher import BatchSizeSearcher
from sweeps.search.strategies import IndependentStrategy, TransferStrategy
from sweeps.search.waves import PrecisionWaves
from sweeps.spec import parse_spec

OLD = Path(__file__).parents[1] / "run" / "data" / "tune_state_e6ea0bf"
#: the searcher attributes of the older layout, now the strategy's or the wave policy's
OLD_KEYS = {
    "transfer",
    "transfer_state",
    "_rr",
    "precision",
    "extra_groups",
    "extra_lrs",
    "waves",
    "precision_outcome",
    "precision_targets",
    "_analyse",
    "_report",
}


@pytest.mark.parametrize("name, cls", [("independent", IndependentStrategy), ("transfer", TransferStrategy)])
def test_the_searcher_holds_the_strategy_its_spec_names(tiny_spec_dict, tmp_path, name, cls):
    d = copy.deepcopy(tiny_spec_dict)
    d["search"]["strategy"] = name
    searcher = BatchSizeSearcher(parse_spec(d), f"sqlite:///{tmp_path / 'o.db'}", "st")
    assert type(searcher.strategy) is cls and searcher.strategy.name == name
    assert isinstance(searcher.wave_policy, PrecisionWaves)


def test_an_old_layout_state_restores_into_the_strategy_and_the_wave_policy():
    with open(OLD / "searcher-state.pkl", "rb") as f:
        state = pickle.load(f)
    assert state["transfer"] is True and OLD_KEYS <= set(state)
    searcher = BatchSizeSearcher.__new__(BatchSizeSearcher)
    searcher.set_state(state)
    assert isinstance(searcher.strategy, TransferStrategy)
    assert searcher.transfer_state == state["transfer_state"] and searcher.transfer_state
    assert searcher.waves == state["waves"] and searcher.precision_outcome == state["precision_outcome"]
    assert searcher.wave_policy.extra_stops == {} and searcher.wave_policy.extra_budget_multiples == {}  # defaults
    assert not OLD_KEYS & set(searcher.__dict__)


def test_an_old_layout_searcher_pickled_whole_unpickles_composed(tiny_spec_dict, tmp_path):
    """Tune pickles the searcher object itself (its experiment state): ``__setstate__`` moves the old attributes."""
    d = copy.deepcopy(tiny_spec_dict)
    d["search"].update(strategy="independent", batch_sizes_sequences=[4, 8, 16])
    searcher = BatchSizeSearcher(parse_spec(d), f"sqlite:///{tmp_path / 'o.db'}", "st")
    searcher.suggest("a")
    old = {k: v for k, v in searcher.get_state().items() if k not in ("strategy", "wave_policy")}
    old.update(
        transfer=False,
        transfer_state={},
        _rr=searcher.strategy._rr,
        **{k: v for k, v in vars(searcher.wave_policy).items() if k != "spec"},
    )
    stale = BatchSizeSearcher.__new__(BatchSizeSearcher)
    stale.__dict__.update(old)  # as an older revision pickled it
    loaded = pickle.loads(pickle.dumps(stale))
    assert isinstance(loaded.strategy, IndependentStrategy) and loaded.strategy._rr == searcher.strategy._rr == 1
    assert not OLD_KEYS & set(loaded.__dict__)
    assert loaded._next_batch() == searcher._next_batch() == 8
