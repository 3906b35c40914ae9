"""``search.initial_points``: known configurations evaluated first at every batch size (real Optuna RDB)."""

from __future__ import annotations

import copy

import optuna
import pytest
from ray.tune.search import Searcher

from sweeps.search.searcher import BatchSizeSearcher
from sweeps.spec import SpecError, parse_spec


def _spec(tiny_spec_dict, points, **search):
    d = copy.deepcopy(tiny_spec_dict)
    d["search"].update(trials_per_batch_size=3, initial_points=points, **search)
    return parse_spec(d)


def _errors(tiny_spec_dict, points, **search) -> str:
    with pytest.raises(SpecError) as ei:
        _spec(tiny_spec_dict, points, **search)
    return "\n".join(f"{p}: {m}" for p, m in ei.value.errors)


@pytest.mark.parametrize(
    "points,needle",
    [
        ([{"lr_rule": "none"}], "initial_points.0.lr_rule: 'none' is not one of lr_rules"),
        ([{"lr_multiplier": 5.0}], "initial_points.0.lr_multiplier: 5 lies outside lr_multiplier [0.5, 2]"),
        ([{"beta2": 0.95}], "initial_points.0.beta2: the spec searches beta2.half_life_tokens"),
        ([{"beta2_half_life_tokens": 100.0}], "initial_points.0.beta2_half_life_tokens: 100 lies outside"),
        ([{"lr_rule": "sqrt"}, {"lr_rule": "sqrt"}], "initial_points.1: the same point as initial_points.0"),
        (
            [{"lr_rule": "sqrt"}, {"lr_rule": "linear"}, {"lr_multiplier": 1.0}, {"lr_multiplier": 0.5}],
            "initial_points: 4 point(s), more than trials_per_batch_size=3",
        ),
        ([{}], "search.initial_points.0: give at least one of"),
        ([{"lr_rule": "sqrt", "lr": 0.01}], "search.initial_points.0.lr"),
        ([{"beta2": 0.9, "beta2_half_life_tokens": 4096}], "give beta2 or beta2_half_life_tokens, not both"),
        ([{"lr_multiplier": -1}], "search.initial_points.0.lr_multiplier"),
    ],
)
def test_initial_points_outside_the_searched_space_are_refused_by_field(tiny_spec_dict, points, needle):
    assert needle in _errors(tiny_spec_dict, points)


def test_beta2_points_need_a_beta2_values_spec(tiny_spec_dict):
    s = _spec(tiny_spec_dict, [{"beta2": 0.95}], beta2={"values": [0.95, 0.99]})
    assert s.search.initial_points[0].given() == {"beta2": 0.95}
    assert "is not one of beta2.values" in _errors(tiny_spec_dict, [{"beta2": 0.9}], beta2={"values": [0.95, 0.99]})


def test_initial_points_are_the_first_trials_of_every_batch_size_and_enqueued_in_optuna(tiny_spec_dict, tmp_path):
    points = [
        {"lr_rule": "linear", "lr_multiplier": 1.25, "beta2_half_life_tokens": 4096.0},
        {"lr_multiplier": 0.75},
    ]  # a partial point: lr_rule and the half-life are sampled
    s = _spec(tiny_spec_dict, points)
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    searcher = BatchSizeSearcher(s, url, "ip", fingerprint=s.fingerprint())
    configs = []
    for i in range(100):
        c = searcher.suggest(f"t{i}")
        if c == Searcher.FINISHED:
            break
        configs.append(c)
    assert len(configs) == s.n_trials == 9  # the points count in trials_per_batch_size
    for b in (4, 8, 16):
        mine = [c for c in configs if c["batch_size_sequences"] == b]
        assert [c.get("initial_point") for c in mine] == [0, 1, None]
        first, second, third = mine
        assert (first["lr_rule"], first["lr_multiplier"], first["beta2_half_life_tokens"]) == ("linear", 1.25, 4096.0)
        assert first["lr"] == pytest.approx(0.003 * (b / 8) * 1.25)
        assert second["lr_multiplier"] == 0.75 and second["lr_rule"] in ("sqrt", "linear")
        study = optuna.load_study(study_name=f"ip-B{b}", storage=url)
        trials = study.get_trials(deepcopy=False)
        assert [t.user_attrs.get("critbatch.initial_point") for t in trials] == [0, 1, None]
        assert trials[0].system_attrs["fixed_params"] == {
            "lr_rule": "linear",
            "lr_multiplier": 1.25,
            "beta2_half_life_tokens": 4096.0,
        }
        assert "fixed_params" not in trials[2].system_attrs  # sampled
        assert study.user_attrs["critbatch.fingerprint"] == s.fingerprint()


def test_a_restored_searcher_does_not_enqueue_the_points_again(tiny_spec_dict, tmp_path):
    s = _spec(tiny_spec_dict, [{"lr_rule": "linear"}], batch_sizes_sequences=[4])
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    searcher = BatchSizeSearcher(s, url, "again")
    assert searcher.suggest("a")["initial_point"] == 0
    path = tmp_path / "searcher.pkl"
    searcher.save(str(path))
    restored = BatchSizeSearcher(s, url, "again")
    restored.restore(str(path))
    later = [restored.suggest(t) for t in ("b", "c")]
    assert [c.get("initial_point") for c in later] == [None, None]
    study = optuna.load_study(study_name="again-B4", storage=url)
    assert [t.user_attrs.get("critbatch.initial_point") for t in study.get_trials(deepcopy=False)] == [0, None, None]
