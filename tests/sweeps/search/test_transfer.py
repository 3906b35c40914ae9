"""``search.strategy: transfer`` (sweeps/search/transfer.py and the searcher's transfer path), driven
directly on a real Optuna RDB: batch sizes outward from the base, each waiting for its anchor, centred on
the anchor's best LR scaled by the measured exponent, and a restored searcher going on where it left."""

from __future__ import annotations

import copy
import math
import pickle

import pytest
from ray.tune.search import Searcher

from sweeps.errors import InvalidInput
from sweeps.search.searcher import OBJECTIVE, BatchSizeSearcher
from sweeps.search.transfer import anchor_of, lr_offsets_octaves, transfer_centre, transfer_order
from sweeps.spec import parse_spec


def test_the_order_runs_outward_from_the_base_and_each_anchor_is_one_step_nearer():
    order = transfer_order([4, 8, 16, 32, 64, 128, 256], 16)
    assert order == [16, 8, 32, 4, 64, 128, 256]
    assert [anchor_of(b, order) for b in order] == [None, 16, 16, 8, 32, 64, 128]
    assert transfer_order([4, 8, 64], 16) == [8, 4, 64]  # the base itself not swept: the nearest one starts
    assert anchor_of(64, [8, 4, 64]) == 8
    assert lr_offsets_octaves(2) == [-0.5, 0.5] and lr_offsets_octaves(3) == [-1.0, 0.0, 1.0]


def test_the_centre_scales_by_the_square_root_rule_until_three_batch_sizes_have_finished():
    assert transfer_centre(32, 16, {16: 4e-3}) == (pytest.approx(4e-3 * math.sqrt(2)), 0.5)
    centre, alpha = transfer_centre(64, 32, {8: 1e-3, 16: 2e-3, 32: 4e-3})  # linear so far: alpha 1
    assert alpha == pytest.approx(1.0) and centre == pytest.approx(8e-3)
    assert transfer_centre(64, 32, {8: 4e-3, 16: 2e-3, 32: 1e-3})[1] == 0.0  # a falling fit is clipped to 0


def _spec(tiny_spec_dict, **search):
    d = copy.deepcopy(tiny_spec_dict)
    d["search"].update(
        {
            "strategy": "transfer",
            "batch_sizes_sequences": [4, 8, 16, 32],
            "base_batch_size_sequences": 8,
            "base_lr": 2e-3,
            "lr_rules": ["sqrt", "linear"],
            "lr_multiplier": [0.5, 2.0],
            "trials_per_batch_size": 2,
            **search,
        }
    )
    d["seeds"] = [0]
    return parse_spec(d)


def _finish(searcher, tid, objective):
    searcher.on_trial_complete(tid, {OBJECTIVE: objective})


def test_transfer_waits_for_each_anchor_and_centres_on_its_best_lr(tiny_spec_dict, tmp_path):
    s = _spec(tiny_spec_dict)
    searcher = BatchSizeSearcher(s, f"sqlite:///{tmp_path / 'o.db'}", "tr")
    a, b = searcher.suggest("a"), searcher.suggest("b")
    assert a["batch_size_sequences"] == b["batch_size_sequences"] == 8
    assert [a["lr"], b["lr"]] == pytest.approx([2e-3 * 2**-0.5, 2e-3 * 2**0.5])  # the start: base LR x 1
    assert a["lr_rule"] == "sqrt" and a["lr_multiplier"] == pytest.approx(2**-0.5)
    assert searcher.suggest("c") is None  # 4 and 16 wait for 8
    _finish(searcher, "a", 2.0)
    assert searcher.suggest("c") is None  # one of 8's two trials still runs
    _finish(searcher, "b", 1.9)  # the higher LR won
    best8 = b["lr"]
    c, d, e, f = (searcher.suggest(t) for t in "cdef")
    assert [x["batch_size_sequences"] for x in (c, d, e, f)] == [4, 4, 16, 16]
    assert math.sqrt(c["lr"] * d["lr"]) == pytest.approx(best8 * math.sqrt(4 / 8))
    assert math.sqrt(e["lr"] * f["lr"]) == pytest.approx(best8 * math.sqrt(16 / 8))
    assert searcher.suggest("g") is None  # 32 waits for 16
    for tid, obj in zip("cdef", (2.2, 2.1, 1.8, 1.85)):
        _finish(searcher, tid, obj)
    g = searcher.suggest("g")
    best = {4: d["lr"], 8: best8, 16: e["lr"]}  # three finished: alpha is fitted over their best LRs
    alpha = searcher.transfer_state[32]["alpha"]
    assert alpha == pytest.approx(min(max(math.log(best[16] / best[4]) / math.log(4), 0.0), 1.0), abs=0.02)
    assert g["batch_size_sequences"] == 32 and searcher.transfer_state[32]["anchor"] == 16
    assert g["lr"] == pytest.approx(best[16] * 2**alpha * 2**-0.5)
    searcher.suggest("h")
    assert searcher.suggest("i") == Searcher.FINISHED


def test_a_batch_size_whose_trials_all_failed_passes_its_centre_on(tiny_spec_dict, tmp_path):
    s = _spec(tiny_spec_dict, batch_sizes_sequences=[8, 16])
    searcher = BatchSizeSearcher(s, f"sqlite:///{tmp_path / 'o.db'}", "fail")
    searcher.suggest("a"), searcher.suggest("b")
    searcher.on_trial_complete("a", error=True)
    searcher.on_trial_complete("b", {OBJECTIVE: float("nan")})
    c = searcher.suggest("c")
    assert math.sqrt(c["lr"] * searcher.suggest("d")["lr"]) == pytest.approx(2e-3 * math.sqrt(2))


def test_a_restored_transfer_searcher_goes_on_as_the_uninterrupted_one(tiny_spec_dict, tmp_path):
    s = _spec(tiny_spec_dict)

    def drive(searcher, tids, objectives):
        out = []
        for tid in tids:
            cfg = searcher.suggest(tid)
            out.append((cfg["batch_size_sequences"], round(cfg["lr"], 12)) if isinstance(cfg, dict) else cfg)
            if tid in objectives:
                _finish(searcher, tid, objectives[tid])
        return out

    objectives = {"a": 2.0, "b": 1.9, "c": 2.2, "d": 2.1, "e": 1.8, "f": 1.85}
    straight = drive(BatchSizeSearcher(s, f"sqlite:///{tmp_path / 'a.db'}", "tr"), "abcdefgh", objectives)
    first = BatchSizeSearcher(s, f"sqlite:///{tmp_path / 'b.db'}", "tr")
    got = drive(first, "abcd", objectives)
    first.save(str(tmp_path / "s.pkl"))
    restored = BatchSizeSearcher(s, f"sqlite:///{tmp_path / 'b.db'}", "tr")
    restored.restore(str(tmp_path / "s.pkl"))
    got += drive(restored, "efgh", objectives)
    assert got == straight and len(set(got)) == 8


def test_transfer_refuses_initial_points_and_pause_mode(tiny_spec_dict):
    d = copy.deepcopy(tiny_spec_dict)
    d["search"].update(strategy="transfer", trials_per_batch_size=2, initial_points=[{"lr_multiplier": 1.0}])
    with pytest.raises((InvalidInput, ValueError), match="initial_points: search.strategy transfer"):
        parse_spec(d)
    d = copy.deepcopy(tiny_spec_dict)
    d["search"].update(strategy="transfer", trials_per_batch_size=2)
    d["pruning"] = {"enabled": True, "mode": "pause"}
    with pytest.raises((InvalidInput, ValueError), match="use pruning.mode stop"):
        parse_spec(d)


def test_many_trials_per_batch_size_stay_within_two_octaves_of_the_centre():
    assert lr_offsets_octaves(1) == [0.0]  # one trial: the centre (allowed: a quick look, nothing searched)
    assert lr_offsets_octaves(5) == [-2.0, -1.0, 0.0, 1.0, 2.0]
    wide = lr_offsets_octaves(9)
    assert wide[0] == -2.0 and wide[-1] == 2.0 and wide[1] - wide[0] == pytest.approx(0.5)


def test_a_searcher_restored_from_a_save_older_than_its_last_ask_asks_the_same_point_again(tiny_spec_dict, tmp_path):
    """Tune saves the searcher now and then: a driver killed after asking B = 8's second group but before
    the next save resumes with a state that never asked it; the restored searcher must place that group
    where the uninterrupted one did (not at the next queued or a random point)."""
    s = _spec(tiny_spec_dict)
    straight = BatchSizeSearcher(s, f"sqlite:///{tmp_path / 'a.db'}", "tr")
    expected = [straight.suggest("a")["lr"], straight.suggest("b")["lr"]]
    first = BatchSizeSearcher(s, f"sqlite:///{tmp_path / 'b.db'}", "tr")
    got = [first.suggest("a")["lr"]]
    first.save(str(tmp_path / "s.pkl"))  # the last save, before the second ask
    first.suggest("b")  # asked (Optuna's trial is created), then the driver dies
    restored = BatchSizeSearcher(s, f"sqlite:///{tmp_path / 'b.db'}", "tr")
    restored.restore(str(tmp_path / "s.pkl"))
    got.append(restored.suggest("b2")["lr"])
    assert got == pytest.approx(expected)


def test_two_seeds_run_each_point_twice_and_beta2_is_carried(tiny_spec_dict, tmp_path):
    d = copy.deepcopy(tiny_spec_dict)
    d["search"].update(
        {
            "strategy": "transfer",
            "batch_sizes_sequences": [8, 16],
            "base_batch_size_sequences": 8,
            "trials_per_batch_size": 2,
        }
    )
    d["seeds"] = [0, 1]
    s = parse_spec(d)
    searcher = BatchSizeSearcher(s, f"sqlite:///{tmp_path / 'o.db'}", "seeds")
    first = [searcher.suggest(t) for t in "abcd"]
    assert [c["seed"] for c in first] == [0, 1, 0, 1] and {c["batch_size_sequences"] for c in first} == {8}
    assert first[0]["lr"] == first[1]["lr"] != first[2]["lr"] == first[3]["lr"]
    assert searcher.suggest("e") is None
    for tid, obj in zip("abcd", (2.0, 2.2, 1.9, 1.9)):
        _finish(searcher, tid, obj)
    later = [searcher.suggest(t) for t in "efgh"]
    assert math.sqrt(later[0]["lr"] * later[2]["lr"]) == pytest.approx(first[2]["lr"] * math.sqrt(2))
    middle = math.sqrt(2048 * 16384)  # the tiny spec's half-life range, carried to every batch size
    assert {round(c["beta2_half_life_tokens"], 6) for c in first + later} == {round(middle, 6)}


def test_transfer_is_the_default_and_a_stored_spec_without_a_strategy_reads_as_independent(tiny_spec_dict):
    from sweeps.spec import parse_stored_spec

    d = copy.deepcopy(tiny_spec_dict)
    assert "strategy" not in d["search"]
    default = parse_spec(d)
    assert default.search.strategy == "transfer" and default.model_dump()["search"]["strategy"] == "transfer"
    paused = copy.deepcopy(d)
    paused["pruning"] = {"enabled": True}  # mode pause by default: transfer cannot run there
    assert parse_spec(paused).search.strategy == "independent"
    pointed = copy.deepcopy(d)
    pointed["search"]["initial_points"] = [{"lr_multiplier": 1.0}]
    assert parse_spec(pointed).search.strategy == "independent"
    # a sweep started before the default changed stored its spec without the strategy (independent then)
    explicit = copy.deepcopy(d)
    explicit["search"]["strategy"] = "independent"
    old_dump = parse_spec(explicit).model_dump(mode="json")
    del old_dump["search"]["strategy"]
    stored = parse_stored_spec(old_dump)
    assert stored.search.strategy == "independent"
    assert stored.fingerprint() == parse_spec(explicit).fingerprint()  # its sweep id and resume checks still hold
    from sweeps.spec.sweep import _spec_from_dump

    assert _spec_from_dump(old_dump).search.strategy == "independent"  # Tune's pickled state of such a sweep
    assert pickle.loads(pickle.dumps(default)).search.strategy == "transfer"
    assert default.fingerprint() != stored.fingerprint()


@pytest.mark.slow
@pytest.mark.timeout(420)  # ~40 s idle (the session's precision sweep, if no test ran it before)
def test_a_transfer_sweep_runs_the_anchor_first_and_centres_the_next_batch_size_on_its_best_lr(precision_sweep):
    """The real path (Tune, Optuna, MLflow, the analysis): 2 batch sizes x 2 trials from base 8. Tune asks
    the searcher while batch size 16 waits for 8 (``suggest`` returns None) and the sweep goes on when 8's
    trials end; 16's two LRs sit half an octave either side of 8's best LR times sqrt(2).

    With ``search.precision`` (an interval no wider than 1.5x, at most 6 trials): two batch sizes give no
    fit, so after the first wave the searcher widens the range upwards: batch size 32 with 2 trials,
    transferred from 16, and the sweep stops at its cap, saying so in ``cbs.json`` and its output.
    (The sweep is ``tests/sweeps/conftest.py``'s, which ``test_precision_resume.py`` interrupts and resumes.)"""
    import json

    out, uri, stdout = precision_sweep.out, precision_sweep.tracking_uri, precision_sweep.stdout
    trials = json.loads((out / "trials.json").read_text())
    trials = trials["trials"] if isinstance(trials, dict) else trials
    by_b = {b: [t for t in trials if t["batch_size_sequences"] == b] for b in (8, 16, 32)}
    assert [len(v) for v in by_b.values()] == [2, 2, 2] and all(t["status"] == "COMPLETED" for t in trials)
    lrs8 = sorted(t["hyperparameters"]["lr"] for t in by_b[8])
    assert lrs8 == pytest.approx([3e-3 * 2**-0.5, 3e-3 * 2**0.5])  # base_lr at the start batch size
    from sweeps.search.transfer import fastest_to_targets, provisional_targets

    def best_lr(ts):  # the searcher's rule in the first wave: fastest over a band of early losses (no spec targets)
        curves = [(t["tokens"], t["val_loss"]) for t in ts]
        return ts[fastest_to_targets([[c] for c in curves], provisional_targets(curves))]["hyperparameters"]["lr"]

    best8 = best_lr(by_b[8])
    lrs16 = sorted(t["hyperparameters"]["lr"] for t in by_b[16])
    assert lrs16 == pytest.approx([best8 * math.sqrt(2) * 2**-0.5, best8 * math.sqrt(2) * 2**0.5])
    best16 = best_lr(by_b[16])
    lrs32 = sorted(t["hyperparameters"]["lr"] for t in by_b[32])
    assert lrs32 == pytest.approx([best16 * math.sqrt(2) * 2**-0.5, best16 * math.sqrt(2) * 2**0.5])
    cbs = json.loads((out / "cbs.json").read_text())
    assert cbs["trials"]["COMPLETED"] == 6
    precision = cbs["precision"]
    assert precision["waves"][0]["trials"] == 4 and precision["waves"][-1]["trials"] == 6
    assert [a["batch_size_sequences"] for a in precision["waves"][0]["added"]] == [32]
    assert precision["max_trials"] == 6 and "precision: upper/lower" in stdout
    from mlflow.tracking import MlflowClient

    # token reallocation: the second wave's trials end at their first milestone at or below the lowest target
    # the first wave declared (past it they inform no target); the first wave's train their whole budget
    stop = min(json.loads((out / "precision.json").read_text())["targets"])
    assert precision["reallocate_tokens"] and precision["stop_at_loss"] == pytest.approx(stop)
    budget = max(len(t["tokens"]) for t in trials)
    for t in by_b[8] + by_b[16]:
        assert len(t["tokens"]) == budget
    for t in by_b[32]:
        assert all(x > stop for x in t["val_loss"][:-1]) and (t["val_loss"][-1] <= stop or len(t["tokens"]) == budget)
    # on this revision (deterministic training) one of them crosses it at its third milestone, 0.05 nats below
    assert sorted(len(t["tokens"]) for t in by_b[32]) == [budget - 1, budget]
    spent = sum(t["tokens"][-1] for t in trials) / by_b[8][0]["tokens"][-1]
    assert precision["budgets_spent"] == pytest.approx(spent) and spent <= 6
    client = MlflowClient(uri)
    runs = client.search_runs(
        [client.get_experiment_by_name("transfer").experiment_id], "tags.`critbatch.role` = 'trial'"
    )
    params = {r.data.tags["critbatch.trial_id"]: r.data.params for r in runs}
    assert all(float(params[t["trial_id"]]["stop_at_loss"]) == pytest.approx(stop) for t in by_b[32])
    assert all("stop_at_loss" not in params[t["trial_id"]] for t in by_b[8] + by_b[16])

    parent = MlflowClient(uri).get_run(cbs["mlflow"]["parent_run_id"])
    assert parent.data.tags["critbatch.precision.stopped_because"] == precision["stopped_because"]
    declared = json.loads((out / "precision.json").read_text())["targets"]
    assert declared and [t["target_loss"] for t in cbs["targets"]] == pytest.approx(sorted(declared, reverse=True))
    if precision["stopped_because"] == "met":  # 3 batch sizes: an interval this narrow is all but impossible
        assert precision["status"] == "ok" and precision["b_crit_ratio"] <= 1.5
    else:
        assert precision["stopped_because"] == "max_trials" and "max_trials (6) reached first" in stdout


def _record(tid, b, lr, losses):
    from sweeps.analysis.targets import TrialRecord

    return TrialRecord(
        trial_id=tid,
        batch_size_sequences=b,
        seed=0,
        group_id=tid,
        status="COMPLETED",
        hyperparameters={"lr": lr},
        tokens=[1024.0 * (i + 1) for i in range(len(losses))],
        val_loss=list(losses),
    )


def test_the_best_lr_is_the_fastest_at_the_fits_targets_not_at_the_lowest_loss_every_trial_reached(
    tiny_spec_dict, tmp_path
):
    """The fastest LR moves with the target loss: a higher LR is faster early (the targets the fit uses), a lower
    one catches up late (the lowest loss every trial reached). The old rule ranked at that low common loss and
    carried the lower LR outward; the searcher ranks at the spec's targets (else the declared ones, else a
    provisional band of early losses)."""
    from sweeps.search.objective import common_target
    from sweeps.search.transfer import fastest_to_targets, provisional_targets

    tokens = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    high_lr = (tokens, [3.0, 2.5, 2.3, 2.2, 2.15, 2.12])  # fast early, then flat
    low_lr = (tokens, [3.4, 2.8, 2.45, 2.2, 2.08, 2.0])  # slow early, lowest late
    assert common_target([high_lr, low_lr]) == pytest.approx(2.15)
    assert fastest_to_targets([[high_lr], [low_lr]], [common_target([high_lr, low_lr])]) == 1  # the old rule
    assert fastest_to_targets([[high_lr], [low_lr]], [2.8, 2.6, 2.4]) == 0  # at the fit's targets: the high LR
    band = provisional_targets([high_lr, low_lr])
    assert band[-1] == pytest.approx(2.45) and band[0] == pytest.approx(2.45 + 0.5 * (3.0 - 2.45)) and len(band) == 4
    assert fastest_to_targets([[high_lr], [low_lr]], band) == 0
    # a trial that never reaches a target counts as slower than any that does; no targets: no choice
    assert fastest_to_targets([[(tokens, [3.0] * 6)], [low_lr]], [2.4]) == 1
    assert fastest_to_targets([[high_lr]], []) is None

    d = copy.deepcopy(tiny_spec_dict)
    d["targets"] = [2.8, 2.6, 2.4]
    s = parse_spec(
        {
            **d,
            "search": {
                **d["search"],
                "strategy": "transfer",
                "batch_sizes_sequences": [8, 16, 32],
                "base_batch_size_sequences": 8,
                "trials_per_batch_size": 2,
            },
        }
    )
    searcher = BatchSizeSearcher(s, f"sqlite:///{tmp_path / 'o.db'}", "tr")
    a, b = searcher.suggest("a"), searcher.suggest("b")
    assert a["lr"] > b["lr"] or a["lr"] < b["lr"]
    hi, lo = (a, b) if a["lr"] > b["lr"] else (b, a)
    records = [_record("h", 8, hi["lr"], high_lr[1]), _record("l", 8, lo["lr"], low_lr[1])]
    ids = {"h": "a" if hi is a else "b", "l": "a" if lo is a else "b"}
    for r in records:
        r.trial_id = ids[r.trial_id]
    searcher.attach_records(lambda: records)
    _finish(searcher, ids["h"], high_lr[1][-1])
    _finish(searcher, ids["l"], low_lr[1][-1])  # the lower final loss, and first to the common loss
    state = searcher.transfer_state[8]
    assert state["best_by"] == "tokens_to_targets" and state["best_lr"] == pytest.approx(hi["lr"])
    c = searcher.suggest("c")
    centre = math.sqrt(c["lr"] * searcher.suggest("d")["lr"])
    assert centre == pytest.approx(hi["lr"] * math.sqrt(c["batch_size_sequences"] / 8))
