"""What each batch size's Optuna study is told (sweeps/search/objective.py): tokens to the batch
size's target loss, the final loss breaking ties and ordering the groups that never reach it; the final loss
where the records cannot be read; the target kept across save and restore. Driven directly on a real Optuna
RDB, as Tune would drive the searcher, with the trials' records handed in by hand (no Ray sweep)."""

from __future__ import annotations

import copy
import logging
import math
import pickle
from pathlib import Path

import optuna
import pytest

from sweeps.analysis.targets import TrialRecord
from sweeps.search.objective import FINAL_LOSS, TIE_BREAK, TOKENS_TO_TARGET, common_target, seed_value
from sweeps.search.searcher import OBJECTIVE, BatchSizeSearcher
from sweeps.spec import parse_spec

TOKENS = [2048.0, 4096.0, 6144.0, 8192.0]  # the tiny spec's milestones (budget 8192 tokens)
BUDGET = 8192.0
FIRST = [3.0, 2.5, 2.3, 2.2]  # the first group: its target is 2.3 (its lowest before the last milestone)
FASTER = [2.6, 2.3, 2.25, 2.28]  # reaches 2.3 at 4 Ki tokens (FIRST: 6 Ki) but ends higher
NEVER_HIGH = [3.0, 2.8, 2.6, 2.5]  # never reaches 2.3
NEVER_LOW = [3.2, 2.9, 2.7, 2.4]  # never reaches 2.3, ends lower than NEVER_HIGH


def _spec(tiny_spec_dict, *, strategy="independent", batches=(8,), trials=4, seeds=(0,)):
    d = copy.deepcopy(tiny_spec_dict)
    d["search"].update(strategy=strategy, batch_sizes_sequences=list(batches), trials_per_batch_size=trials)
    d["seeds"] = list(seeds)
    return parse_spec(d)


class _Records:
    """The driver's report log, played by hand: ``records()`` returns what has been added so far."""

    def __init__(self):
        self.by_id: dict[str, TrialRecord] = {}

    def add(self, tid: str, cfg: dict, losses: list[float]) -> None:
        self.by_id[tid] = TrialRecord(
            trial_id=tid,
            batch_size_sequences=cfg["batch_size_sequences"],
            seed=cfg["seed"],
            group_id=cfg["group_id"],
            status="COMPLETED",
            hyperparameters={},
            tokens=list(TOKENS),
            val_loss=list(losses),
        )

    def __call__(self) -> list[TrialRecord]:
        return list(self.by_id.values())


def _run(searcher, records, tid, cfg, losses):
    """One trial ends: its curve reaches the report log, then Tune tells the searcher its final loss."""
    records.add(tid, cfg, losses)
    searcher.on_trial_complete(tid, {OBJECTIVE: losses[-1]})


def _told(storage_url, study_name):
    study = optuna.load_study(study_name=study_name, storage=storage_url)
    return study, [t for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE]


def test_the_seed_value_is_log_tokens_to_the_target_and_never_reaching_it_is_worse_and_ordered_by_final_loss():
    assert common_target([(TOKENS, FIRST), (TOKENS, FASTER)]) == 2.3  # max(2.3, 2.25)
    assert common_target([(TOKENS, [3.0, math.nan]), None]) is None and common_target([(TOKENS[:1], [2.0])]) == 2.0
    # FIRST crosses 2.3 exactly at 6 Ki; halfway from 2.5 to 2.3 (2.4) is halfway in log tokens from 4 Ki to 6 Ki
    assert seed_value((TOKENS, FIRST), 2.2, 2.3, BUDGET) == pytest.approx((math.log(6144) + TIE_BREAK * 2.2, 6144))
    assert seed_value((TOKENS, FIRST), 2.2, 2.4, BUDGET)[1] == pytest.approx(math.sqrt(4096 * 6144))
    never = seed_value((TOKENS, NEVER_HIGH), 2.5, 2.3, BUDGET)
    assert never == pytest.approx((math.log(8192) + 1 + 2.5, None))
    assert seed_value((TOKENS, [3.0, math.nan]), math.log(65), 2.3, BUDGET)[0] == pytest.approx(
        math.log(8192) + 1 + math.log(65)
    )  # diverged: its objective is ln(vocab)
    assert seed_value(None, 2.2, 2.3, BUDGET)[1] is None  # no record: not reached
    assert seed_value((TOKENS, FIRST), 2.2, None, BUDGET)[1] is None  # no target yet


def test_a_group_faster_to_the_target_is_told_better_though_its_final_loss_is_worse(tiny_spec_dict, tmp_path):
    """Independent strategy, two seeds per group: the first group fixes the target (2.3); the group that reaches
    it sooner is better even though it ends higher; groups that never reach it are worse than every group that
    does and ordered by their final loss; each Optuna trial and the study say what the value is."""
    url = f"sqlite:///{tmp_path / 'o.db'}"
    searcher = BatchSizeSearcher(_spec(tiny_spec_dict, seeds=(0, 1)), url, "obj")
    records = _Records()
    searcher.attach_records(records)
    curves = {"a": FIRST, "b": FASTER, "c": NEVER_HIGH, "d": NEVER_LOW}
    for g, losses in curves.items():
        for seed in (0, 1):
            tid = f"{g}{seed}"
            _run(searcher, records, tid, searcher.suggest(tid), [x - 0.01 * seed for x in losses])
    assert searcher.objectives == {8: {"objective": TOKENS_TO_TARGET, "target_loss": 2.3}}
    study, trials = _told(url, "obj-B8")
    assert (
        study.user_attrs["critbatch.objective"] == TOKENS_TO_TARGET and study.user_attrs["critbatch.target_loss"] == 2.3
    )
    by_group = dict(zip("abcd", [t.value for t in sorted(trials, key=lambda t: t.number)]))
    assert by_group["b"] < by_group["a"] < by_group["d"] < by_group["c"]
    # a: seed 0 at exactly 6 Ki; seed 1 (0.01 lower) from 2.49 at 4 Ki to 2.29 at 6 Ki: 95 % of the way in log tokens
    seed1 = math.exp(math.log(4096) + (2.49 - 2.3) / (2.49 - 2.29) * math.log(6144 / 4096))
    assert by_group["a"] == pytest.approx((math.log(6144) + math.log(seed1) + TIE_BREAK * (2.2 + 2.19)) / 2)
    assert by_group["c"] == pytest.approx(math.log(8192) + 1 + (2.5 + 2.49) / 2)
    first = min(trials, key=lambda t: t.number)
    assert first.user_attrs["critbatch.tokens_to_target"] == pytest.approx([6144, seed1])
    assert first.user_attrs["critbatch.objective"] == TOKENS_TO_TARGET
    assert first.user_attrs["critbatch.final_loss"] == pytest.approx(2.195)


def test_under_transfer_the_study_is_told_tokens_too(tiny_spec_dict, tmp_path):
    url = f"sqlite:///{tmp_path / 'o.db'}"
    searcher = BatchSizeSearcher(_spec(tiny_spec_dict, strategy="transfer", batches=(8, 16), trials=2), url, "tr")
    records = _Records()
    searcher.attach_records(records)
    a, b = searcher.suggest("a"), searcher.suggest("b")
    _run(searcher, records, "a", a, FIRST)
    _run(searcher, records, "b", b, FASTER)
    _, trials = _told(url, "tr-B8")
    told = {t.params["lr_offset_octaves"]: t.value for t in trials}
    assert told[0.5] < told[-0.5]  # b (the higher LR) reached 2.3 first
    assert searcher.transfer_state[8]["best_lr"] == pytest.approx(b["lr"])  # the best LR agrees


def test_optuna_dashboard_shows_the_objective_by_name_and_each_trials_lr_and_batch_size(tiny_spec_dict, tmp_path):
    """optuna-dashboard showed "Objective 0" and only ``lr_offset_octaves`` (under transfer the study samples an
    offset from the batch size's centre LR): the study names its metric, and each group's Optuna trial carries
    the LR it trained at and its batch size as user attributes."""
    url = f"sqlite:///{tmp_path / 'o.db'}"
    searcher = BatchSizeSearcher(
        _spec(tiny_spec_dict, strategy="transfer", batches=(8, 16), trials=2, seeds=(0, 1)), url, "dash"
    )
    records = _Records()
    searcher.attach_records(records)
    cfgs = {t: searcher.suggest(t) for t in ("a0", "a1", "b0", "b1")}  # two groups of two seeds at B = 8
    assert [c["group_id"] for c in cfgs.values()] == ["a0", "a0", "b0", "b0"]
    study = optuna.load_study(study_name="dash-B8", storage=url)
    assert study.metric_names == ["ln_tokens_to_target_loss"]  # from its first trial on
    asked = sorted(study.get_trials(), key=lambda t: t.number)
    assert [t.user_attrs["critbatch.lr"] for t in asked] == [
        pytest.approx(cfgs["a0"]["lr"]),
        pytest.approx(cfgs["b0"]["lr"]),
    ]
    assert [t.user_attrs["critbatch.batch_size_sequences"] for t in asked] == [8, 8]
    assert cfgs["a0"]["lr"] != cfgs["b0"]["lr"] and "critbatch.lr" not in asked[0].params
    for tid, losses in (("a0", FIRST), ("a1", FIRST), ("b0", FASTER), ("b1", FASTER)):
        _run(searcher, records, tid, cfgs[tid], losses)
    study, trials = _told(url, "dash-B8")
    assert len(trials) == 2 and study.metric_names == ["ln_tokens_to_target_loss"]
    assert sorted(t.user_attrs["critbatch.lr"] for t in trials) == pytest.approx(
        sorted([cfgs["a0"]["lr"], cfgs["b0"]["lr"]])
    )


def test_without_records_the_study_is_told_the_final_loss_for_good(tiny_spec_dict, tmp_path, caplog):
    url = f"sqlite:///{tmp_path / 'o.db'}"
    searcher = BatchSizeSearcher(_spec(tiny_spec_dict, batches=(8, 16), trials=2), url, "fb")
    cfgs = {t: searcher.suggest(t) for t in "abcd"}
    by_b = {b: [t for t, c in cfgs.items() if c["batch_size_sequences"] == b] for b in (8, 16)}
    with caplog.at_level(logging.WARNING, logger="sweeps.search.objective"):
        searcher.on_trial_complete(by_b[8][0], {OBJECTIVE: 2.2})  # nothing attached
    assert "no records attached" in caplog.text
    records = _Records()
    searcher.attach_records(records)  # attached later: B = 8 stays on the final loss (one study, one scale)
    _run(searcher, records, by_b[8][1], cfgs[by_b[8][1]], FASTER)

    def broken():
        raise OSError("the report log is gone")

    searcher.attach_records(broken)
    with caplog.at_level(logging.WARNING, logger="sweeps.search.objective"):
        searcher.on_trial_complete(by_b[16][0], {OBJECTIVE: 2.4})
    assert "the report log is gone" in caplog.text
    assert searcher.objectives == {
        8: {"objective": FINAL_LOSS, "target_loss": None},
        16: {"objective": FINAL_LOSS, "target_loss": None},
    }
    study, trials = _told(url, "fb-B8")
    assert sorted(t.value for t in trials) == [2.2, 2.28] and study.user_attrs["critbatch.objective"] == FINAL_LOSS
    assert study.metric_names == ["final_val_loss"]  # what optuna-dashboard calls its values
    assert [t.value for t in _told(url, "fb-B16")[1]] == [2.4]


def test_a_restored_searcher_keeps_the_target(tiny_spec_dict, tmp_path):
    """The second group's own curve would give another target (2.25): the restored searcher tells it at the
    target the first group fixed before the save (2.3), through ``save``/``restore`` and Tune's ``get_state``."""
    url = f"sqlite:///{tmp_path / 'o.db'}"
    spec = _spec(tiny_spec_dict, trials=2)
    first = BatchSizeSearcher(spec, url, "rs")
    records = _Records()
    first.attach_records(records)
    a, b = first.suggest("a"), first.suggest("b")
    _run(first, records, "a", a, FIRST)
    first.save(str(tmp_path / "s.pkl"))
    assert first.get_state()["objectives"] == {8: {"objective": TOKENS_TO_TARGET, "target_loss": 2.3}}
    restored = BatchSizeSearcher(spec, url, "rs")
    restored.restore(str(tmp_path / "s.pkl"))
    assert restored.objectives == first.objectives and restored._records is None
    restored.attach_records(records)
    _run(restored, records, "b", b, FASTER)
    b_told = max(_told(url, "rs-B8")[1], key=lambda t: t.number)
    assert b_told.value == pytest.approx(math.log(4096) + TIE_BREAK * 2.28)  # 2.3 at 4 Ki (2.25: 6 Ki)
    assert b_told.user_attrs["critbatch.target_loss"] == 2.3


OLD = Path(__file__).parents[1] / "run" / "data" / "tune_state_e6ea0bf"


def test_an_old_searcher_pickle_without_objectives_restores_and_tells_tokens(tmp_path):
    """The Tune state of a sweep started on e6ea0bf (before the tokens-to-target objective; a transfer sweep whose batch size 8 had
    one trial running): restored against a copy of its Optuna storage, it tells that trial tokens to a target."""
    with open(OLD / "searcher-state.pkl", "rb") as f:
        state = pickle.load(f)
    assert "objectives" not in state
    url = f"sqlite:///{tmp_path / 'o.db'}"
    state["storage_url"] = url
    study = optuna.create_study(storage=url, study_name=f"{state['study_prefix']}-B8")
    assert study.ask()._trial_id == state["_subs_ot_trials"][8]["c7dfb1ec"]  # the trial it had asked
    with open(tmp_path / "old.pkl", "wb") as f:
        pickle.dump(state, f)
    searcher = BatchSizeSearcher(state["spec"], url, state["study_prefix"])
    searcher.restore(str(tmp_path / "old.pkl"))
    assert searcher.objectives == {}
    records = _Records()
    searcher.attach_records(records)
    _run(searcher, records, "c7dfb1ec", {"batch_size_sequences": 8, "seed": 0, "group_id": "c7dfb1ec"}, FIRST)
    assert searcher.objectives == {8: {"objective": TOKENS_TO_TARGET, "target_loss": 2.3}}
    assert study.get_trials()[0].value == pytest.approx(math.log(6144) + TIE_BREAK * 2.2)
    tune_side = BatchSizeSearcher.__new__(BatchSizeSearcher)
    tune_side.set_state({k: v for k, v in state.items() if k != "objectives"})
    assert tune_side.objectives == {}
