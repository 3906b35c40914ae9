"""The batch-size searcher against real Optuna RDB storage."""

import copy

import optuna
import pytest
from ray.tune.search import Searcher

from sweeps.search.searcher import BatchSizeSearcher, hyperparameters_for, search_space
from sweeps.spec import parse_spec
from sweeps.tracking.writer import Outbox


def make(tiny_spec_dict, tmp_path, **search):
    d = copy.deepcopy(tiny_spec_dict)
    d["search"].update({"strategy": "independent", **search})  # these test the independent studies
    d["seeds"] = [0, 1]
    s = parse_spec(d)
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    return s, BatchSizeSearcher(s, url, "sw"), url


def test_emits_exactly_the_planned_trials_round_robin_with_seeds(tiny_spec_dict, tmp_path):
    s, searcher, _ = make(tiny_spec_dict, tmp_path, trials_per_batch_size=2)
    configs = []
    for i in range(100):
        c = searcher.suggest(f"t{i}")
        if c == Searcher.FINISHED:
            break
        configs.append(c)
    assert len(configs) == s.n_trials == 3 * 2 * 2
    for b in (4, 8, 16):
        mine = [c for c in configs if c["batch_size_sequences"] == b]
        assert len(mine) == 4
        # each Optuna suggestion runs once per seed, with identical hyperparameters
        groups = {}
        for c in mine:
            groups.setdefault(c["group_id"], []).append(c)
        assert len(groups) == 2
        for g in groups.values():
            assert sorted(c["seed"] for c in g) == [0, 1]
            assert len({(c["lr"], c["beta2"], c["lr_rule"]) for c in g}) == 1
    # consecutive suggestions interleave batch sizes, so concurrent trials differ in batch size
    assert configs[0]["batch_size_sequences"] != configs[1]["batch_size_sequences"]


def test_group_outcomes_reach_optuna_as_complete_pruned_fail(tiny_spec_dict, tmp_path):
    s, searcher, url = make(tiny_spec_dict, tmp_path, trials_per_batch_size=3, batch_sizes_sequences=[4])
    ids = [f"t{i}" for i in range(6)]
    cfgs = [searcher.suggest(i) for i in ids]
    assert all(c["batch_size_sequences"] == 4 for c in cfgs)
    # group 1: both seeds complete -> COMPLETE with the mean objective
    searcher.on_trial_complete("t0", {"objective": 2.0})
    searcher.on_trial_complete("t1", {"objective": 3.0})
    # group 2: one seed pruned -> PRUNED
    searcher.on_trial_complete("t2", {"objective": 2.5, "pruned": True})
    searcher.on_trial_complete("t3", {"objective": 2.5})
    # group 3: both seeds errored -> FAIL
    searcher.on_trial_complete("t4", None, error=True)
    searcher.on_trial_complete("t5", None, error=True)
    study = optuna.load_study(study_name="sw-B4", storage=url)
    states = [t.state for t in study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL]
    assert study.trials[0].value == pytest.approx(2.5)


def test_hyperparameters_follow_rule_and_half_life(tiny_spec_dict):
    s = parse_spec({**tiny_spec_dict, "search": {**tiny_spec_dict["search"], "strategy": "independent"}})
    hp = hyperparameters_for(s, 32, {"lr_rule": "linear", "lr_multiplier": 2.0, "beta2_half_life_tokens": 1024.0})
    assert hp["lr"] == pytest.approx(0.003 * (32 / 8) * 2.0)
    assert hp["beta2"] == pytest.approx(0.5 ** (32 * 32 / 1024))
    assert set(search_space(s)) == {"lr_rule", "lr_multiplier", "beta2_half_life_tokens"}


def test_outbox_keeps_order_and_retries():
    calls, fail = [], {"on": True}

    def write(x):
        def fn():
            if fail["on"]:
                raise ConnectionError("down")
            calls.append(x)

        return fn

    box = Outbox()
    box.put("a", write(1))
    box.put("b", write(2))
    assert calls == [] and len(box.pending) == 2
    fail["on"] = False
    assert box.flush() and calls == [1, 2] and not box.pending
    fail["on"] = True
    box.put("c", write(3))
    assert not box.drain(timeout_s=0.2, interval_s=0.05)
    assert box.failures >= 3


def test_pause_mode_gate_and_pruned_while_paused(tiny_spec_dict, tmp_path):
    """In pruning mode "pause" the scheduler gates new trials (paused ones do not count as running) and
    a trial pruned while paused (Tune reports no result for it) reaches its study as PRUNED."""
    from sweeps.pruning.scheduler import EqualComputeScheduler

    s, searcher, url = make(tiny_spec_dict, tmp_path, trials_per_batch_size=2, batch_sizes_sequences=[4])
    s = parse_spec(
        {
            **s.model_dump(),
            "seeds": [0],
            "pruning": {"enabled": True, "mode": "pause"},
            "resources": {"max_concurrent_trials": 1},
        }
    )
    searcher = BatchSizeSearcher(s, url, "gate")
    sched = EqualComputeScheduler.from_spec(s)
    searcher.scheduler = sched
    assert searcher.suggest("a")["batch_size_sequences"] == 4
    assert searcher.suggest("b") is None  # one trial running, max_concurrent_trials 1
    sched.waiting["a"] = 0  # "a" waits paused at a rung: its slot is free
    assert searcher.suggest("b")["batch_size_sequences"] == 4
    assert searcher.exhausted() and searcher.suggest("c") == Searcher.FINISHED
    sched.pruned_while_paused["a"] = {"pruned": True, "pruned_rung": 0}
    searcher.on_trial_complete("a")  # Tune's call for a PAUSED trial that is stopped: no result
    searcher.on_trial_complete("b", {"objective": 2.0})
    study = optuna.load_study(study_name="gate-B4", storage=url)
    assert sorted(t.state.name for t in study.get_trials(deepcopy=False)) == ["COMPLETE", "PRUNED"]
    # the searcher's saved state leaves the scheduler out; a restore keeps the one attached now
    path = tmp_path / "searcher.pkl"
    searcher.save(str(path))
    other = BatchSizeSearcher(s, url, "gate")
    other.scheduler = sched
    other.restore(str(path))
    assert other.scheduler is sched and other.assigned == {4: 2}


def test_a_restored_searcher_does_not_repeat_the_hyperparameters_already_asked(tiny_spec_dict, tmp_path):
    """After a driver kill the searcher is restored from its saved state: its Optuna samplers are rebuilt,
    and seeded as at the start they would propose the first trials' hyperparameters again."""
    s, searcher, url = make(tiny_spec_dict, tmp_path, trials_per_batch_size=4, batch_sizes_sequences=[4])
    s = parse_spec({**s.model_dump(), "seeds": [0]})
    searcher = BatchSizeSearcher(s, url, "again")
    first = [searcher.suggest(t) for t in ("a", "b")]
    path = tmp_path / "searcher.pkl"
    searcher.save(str(path))
    restored = BatchSizeSearcher(s, url, "again")
    restored.restore(str(path))
    later = [restored.suggest(t) for t in ("c", "d")]

    def key(c):
        return (c["lr_rule"], c["lr_multiplier"], c["beta2"])

    assert len({key(c) for c in first + later}) == 4
    # a fresh study is seeded as before: the same spec proposes the same first trial
    fresh = BatchSizeSearcher(s, f"sqlite:///{tmp_path / 'other.db'}", "again")
    assert key(fresh.suggest("a")) == key(first[0])


def test_the_study_storage_gives_sqlite_alone_its_lock_wait(tmp_path):
    """A server database (PostgreSQL through psycopg2) refuses SQLite's ``timeout`` connect option."""
    from sweeps.search.space import study_connect_args, study_storage

    assert study_storage(f"sqlite:///{tmp_path / 'optuna.db'}").engine.dialect.name == "sqlite"
    assert study_connect_args(f"sqlite:///{tmp_path / 'optuna.db'}") == {"timeout": 30}
    assert study_connect_args("postgresql://u:p@db:5432/optuna") == {}
    assert study_connect_args("postgresql+psycopg2://u:p@db/optuna") == {}
