"""``benchmarks/search_efficiency.py`` builds a spec the product accepts in every pruning mode it offers: it composed
the main job's spec (now ``search.strategy: transfer`` with ``search.precision``) with ``pruning.mode: pause``,
which the spec refuses, and crashed before its first trial."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("search_efficiency", ROOT / "benchmarks" / "search_efficiency.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


@pytest.mark.parametrize("quick", [True, False], ids=["quick", "full"])
@pytest.mark.parametrize("mode", [None, "pause", "stop"])
def test_the_benchmark_spec_validates_in_every_pruning_mode(bench, quick, mode):
    spec = bench.make_spec(quick, [0.7, 1, 1.4, 2, 2.8, 4], 4, 2, {"mode": mode} if mode else {})
    assert spec.pruning.enabled and spec.pruning.mode == (mode or "pause")
    # what the replay plays: per batch size its own Optuna study over the grid's multipliers, the planned trials only
    assert spec.search.strategy == "independent" and spec.search.precision is None
    assert spec.search.lr_multiplier == (0.7, 4.0) and spec.search.trials_per_batch_size == 4
    assert spec.search.batch_sizes_sequences == ([4, 8, 16, 32] if quick else [4, 8, 16, 32, 64, 128])
    # --quick's tiny model never reaches the example's fixed target losses: its targets come from its curves
    assert (spec.targets is None) == quick
