"""``search.precision`` (sweeps/search/precision.py and the searcher's waves): the rules that pick a wave's
trials, and a whole sweep-until-precise run on simulated training curves with a known ``b_crit``, driven
through the real searcher (real Optuna RDB) and the real analysis, uninterrupted and restored mid-way."""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
from ray.tune.search import Searcher

from sweeps.analysis import analyze_trials
from sweeps.analysis.targets import TrialRecord
from sweeps.errors import InvalidInput
from sweeps.search.precision import Proposal, Reallocation, interval_ratio, precise_enough, propose
from sweeps.search.searcher import OBJECTIVE, BatchSizeSearcher
from sweeps.spec import parse_spec

B_TRUE = 24.0  # the simulated sweep's critical batch size (sequences)


def _spec(tiny_spec_dict, *, precision=None, strategy="transfer", batch_sizes=(4, 8, 16, 32, 64), trials=2):
    d = copy.deepcopy(tiny_spec_dict)
    d["budget_tokens"] = 262144
    d["eval"]["milestones"] = 16
    d["search"].update(
        {
            "strategy": strategy,
            "batch_sizes_sequences": list(batch_sizes),
            "base_batch_size_sequences": 16,
            "base_lr": 2e-3,
            "trials_per_batch_size": trials,
        }
    )
    if precision is not None:
        d["search"]["precision"] = precision
    d["seeds"] = [0]
    return parse_spec(d)


def _curve(
    spec, b: int, lr: float, noise: float, *, budget_tokens: int | None = None, stop_at_loss: float | None = None
) -> tuple[list[float], list[float]]:
    """Loss at the spec's milestones of a trial whose data inefficiency is ``(1 + B / B_TRUE)`` times an LR
    penalty (quadratic in octaves from ``lr_opt(B) = 2e-3 sqrt(B / 16)``) times ``noise``: its steps to any
    target are then ``c (1 / B + 1 / B_TRUE)``, i.e. ``b_crit = B_TRUE`` (McCandlish et al. 2018, Eq. 2.11).
    ``budget_tokens`` and ``stop_at_loss`` as the trial config's (token reallocation): the milestones go on at
    the spec's spacing to the trial's budget, and the curve ends at its first loss at or below the stop."""
    lr_opt = 2e-3 * math.sqrt(b / 16)
    f = (1 + b / B_TRUE) * math.exp(0.3 * math.log2(lr / lr_opt) ** 2) * noise
    tokens = [float(t) for t in spec.milestones_tokens(budget_tokens)]
    losses = [2.0 + 3.0 * (t / (f * spec.budget_tokens / 400)) ** -0.3 for t in tokens]
    if stop_at_loss is not None:
        end = next((i + 1 for i, x in enumerate(losses) if x <= stop_at_loss), len(losses))
        tokens, losses = tokens[:end], losses[:end]
    return tokens, losses


class _SimulatedSweep:
    """Tune's part, played by hand: ask the searcher until it waits, run every asked trial at once on
    :func:`_curve`, tell it each result; the searcher's analysis is the real one on these records."""

    def __init__(self, spec, searcher: BatchSizeSearcher):
        self.spec, self.searcher = spec, searcher
        self.records: dict[str, TrialRecord] = {}
        self.configs: dict[str, dict] = {}
        self.asked: list[tuple[str, int, float]] = []
        self.reports: list[tuple[list, dict | None, int]] = []
        self.attach(searcher)

    def attach(self, searcher: BatchSizeSearcher) -> None:
        self.searcher = searcher

        def analyse(targets):
            records = list(self.records.values())
            return analyze_trials(
                records,
                context_length_tokens=self.spec.model.context_length_tokens,
                reference_batch=16.0,
                targets=targets,
            ), records

        searcher.attach_precision(
            analyse, lambda waves, outcome, planned, targets: self.reports.append((waves, outcome, planned, targets))
        )

    def step(self) -> bool:
        """One round; False once the searcher said FINISHED."""
        batch = []
        while True:
            tid = f"t{len(self.asked) + len(batch):03d}"
            cfg = self.searcher.suggest(tid)
            if cfg == Searcher.FINISHED:
                self._run(batch)
                return False
            if cfg is None:
                break
            batch.append((tid, cfg))
        self._run(batch)
        return True

    def _run(self, batch) -> None:
        for tid, cfg in batch:
            b, lr = int(cfg["batch_size_sequences"]), float(cfg["lr"])
            # the trial's own noise, from its seed: the same batch size, LR and seed give the same curve, as a
            # deterministic re-run does (token reallocation re-runs a trial with a longer budget)
            seen = {(bb, round(ll, 12)) for _, bb, ll in self.asked}
            key = (
                len(self.asked)
                if (b, round(lr, 12)) not in seen
                else next(i for i, (_, bb, ll) in enumerate(self.asked) if (bb, round(ll, 12)) == (b, round(lr, 12)))
            )
            noise = math.exp(0.05 * np.random.default_rng(key).standard_normal())
            tokens, losses = _curve(
                self.spec, b, lr, noise, budget_tokens=cfg.get("budget_tokens"), stop_at_loss=cfg.get("stop_at_loss")
            )
            self.records[tid] = TrialRecord(
                trial_id=tid,
                batch_size_sequences=b,
                seed=0,
                group_id=tid,
                status="COMPLETED",
                hyperparameters={"lr": lr},
                tokens=tokens,
                val_loss=losses,
            )
            self.asked.append((tid, b, lr))
            self.configs[tid] = cfg
            self.searcher.on_trial_complete(tid, {OBJECTIVE: losses[-1]})

    def run(self, rounds: int = 100) -> None:
        for _ in range(rounds):
            if not self.step():
                return
        raise AssertionError("the searcher never finished")


def test_the_ratio_and_what_counts_as_precise():
    assert interval_ratio([10.0, 30.0]) == pytest.approx(3.0)
    assert (
        interval_ratio([10.0, None]) == math.inf
        and interval_ratio(None) == math.inf
        and interval_ratio([0.0, 5.0]) == math.inf
    )
    assert precise_enough({"status": "ok", "b_crit_ci": [10.0, 29.0]}, 3.0)
    assert not precise_enough({"status": "edge", "b_crit_ci": [10.0, 29.0]}, 3.0)  # narrow but past an end
    assert not precise_enough({"status": "ok", "b_crit_ci": [10.0, 31.0]}, 3.0)


def _records(rows: list[tuple[int, float, float]], spec) -> list[TrialRecord]:
    """One trial per ``(batch size, lr, slowdown)``, on :func:`_curve` with ``slowdown`` as its noise."""
    out = []
    for i, (b, lr, slow) in enumerate(rows):
        tokens, losses = _curve(spec, b, lr, slow)
        out.append(
            TrialRecord(
                trial_id=f"r{i}",
                batch_size_sequences=b,
                seed=0,
                group_id=f"r{i}",
                status="COMPLETED",
                hyperparameters={"lr": lr},
                tokens=tokens,
                val_loss=losses,
            )
        )
    return out


def test_a_wave_probes_beyond_an_open_lr_bracket_nearest_the_knee_first(tiny_spec_dict):
    spec = _spec(tiny_spec_dict)
    opt = {b: 2e-3 * math.sqrt(b / 16) for b in (8, 16, 32)}
    # 16 and 32 were fastest at their highest tried LR (open above); 8 at its lower LR, with one below it
    rows = [
        (8, opt[8] / 4, 1),
        (8, opt[8], 1),
        (8, opt[8] * 2, 1),
        (16, opt[16] / 4, 1),
        (16, opt[16] / 2, 1),
        (32, opt[32] / 4, 1),
        (32, opt[32] / 2, 1),
    ]
    records = _records(rows, spec)
    analysis = analyze_trials(records, context_length_tokens=32, reference_batch=16.0)
    assert analysis["fitted_batch_sizes"] == [8.0, 16.0, 32.0]
    got = propose(
        {**analysis.to_json_dict(), "b_crit": 20.0, "b_crit_ci": [10.0, 30.0], "status": "ok"},
        records,
        3,
        allowed_batch_size=spec.sweepable_batch_size,
    )
    assert [(p.batch_size_sequences, round(p.lr / opt[p.batch_size_sequences], 6)) for p in got[:2]] == [
        (16, 1.0),
        (32, 1.0),
    ]  # an octave above each fastest LR, 16 first (nearer 20)
    assert (got[2].batch_size_sequences, got[2].lr) == (23, None)  # then a new batch size between 16 and 32
    more = propose(
        {**analysis.to_json_dict(), "b_crit": 20.0, "b_crit_ci": [10.0, 30.0], "status": "ok"},
        records,
        5,
        allowed_batch_size=spec.sweepable_batch_size,
    )
    assert (more[3].batch_size_sequences, more[3].lr) == (11, None)  # the middle of 8 and 16
    # last, the closed bracket at 8: halfway (in log) between its fastest LR and its faster neighbour
    assert (more[4].batch_size_sequences, round(more[4].lr / opt[8], 6)) == (8, round(math.sqrt(2), 6))
    assert all(isinstance(p, Proposal) and p.reason for p in got)


def test_a_new_batch_size_must_be_one_the_spec_can_run(tiny_spec_dict):
    spec = _spec(tiny_spec_dict)
    assert spec.sweepable_batch_size(128) and spec.sweepable_batch_size(23)
    assert not spec.sweepable_batch_size(1024)  # a step longer than the milestone spacing (16384 tokens)
    d = copy.deepcopy(tiny_spec_dict)
    d["resources"] = {"workers_per_trial": 2, "max_concurrent_trials": 1}
    d["search"]["batch_sizes_sequences"] = [4, 8, 16]
    assert not parse_spec(d).sweepable_batch_size(11) and parse_spec(d).sweepable_batch_size(12)


def test_a_wave_widens_the_range_on_the_side_the_interval_reaches_past(tiny_spec_dict):
    spec = _spec(tiny_spec_dict)
    records = _records([(b, 2e-3 * math.sqrt(b / 16), 1) for b in (4, 8, 16, 32, 64)], spec)
    base = {"target_loss": None, "fitted_batch_sizes": [4.0, 8.0, 16.0, 32.0, 64.0]}
    up = propose(
        {**base, "status": "edge", "b_crit": 50.0, "b_crit_ci": [20.0, 200.0]},
        records,
        2,
        allowed_batch_size=spec.sweepable_batch_size,
    )
    assert [p.batch_size_sequences for p in up] == [128]
    missed = propose(
        {
            **base,
            "fitted_batch_sizes": [4.0, 8.0, 16.0, 32.0],
            "status": "edge",
            "b_crit": 50.0,
            "b_crit_ci": [20.0, 200.0],
        },
        records,
        2,
        allowed_batch_size=spec.sweepable_batch_size,
    )
    assert missed == []  # 64 already misses the target: a larger batch size would not join the fit
    both = propose(
        {**base, "fitted_batch_sizes": [], "status": "no_knee", "b_crit": None, "b_crit_ci": None},
        records,
        2,
        allowed_batch_size=spec.sweepable_batch_size,
    )
    assert [p.batch_size_sequences for p in both] == [128, 2]
    capped = propose(
        {**base, "status": "above_range", "b_crit": None, "b_crit_ci": None},
        records,
        2,
        allowed_batch_size=lambda b: b <= 64,
    )  # a batch size the budget cannot take is not added
    assert [
        p.batch_size_sequences
        for p in propose(
            {**base, "status": "above_range", "b_crit": None, "b_crit_ci": None},
            records,
            2,
            allowed_batch_size=lambda b: True,
        )
    ] == [128]
    assert capped == []


def test_an_lr_already_tried_is_not_proposed_again(tiny_spec_dict):
    spec = _spec(tiny_spec_dict)
    lr = 2e-3
    # 16's fastest LR has a faster neighbour 0.3 octave above: the halfway probe would sit 0.15 octave from both
    rows = [
        (16, lr / 2, 1.3),
        (16, lr, 1.0),
        (16, lr * 2**0.3, 1.05),
        (32, lr / 2, 1.3),
        (32, lr, 1.0),
        (32, lr * 2, 1.1),
    ]
    records = _records(rows, spec)
    analysis = {
        "status": "ok",
        "b_crit": 16.0,
        "b_crit_ci": [17.0, 30.0],
        "fitted_batch_sizes": [16.0, 32.0],
        "target_loss": max(r.val_loss[8] for r in records),
    }  # every trial crosses it mid-way
    got = propose(analysis, records, 5, allowed_batch_size=spec.sweepable_batch_size)
    probes = [(p.batch_size_sequences, round(math.log2(p.lr / lr), 6)) for p in got if p.lr is not None]
    assert probes == [(32, 0.5)]  # none at 16
    assert [p.batch_size_sequences for p in got if p.lr is None] == [23]  # and the middle of 16 and 32


def test_the_spec_refuses_a_cap_below_the_plan_and_pause_mode(tiny_spec_dict):
    d = copy.deepcopy(tiny_spec_dict)
    d["search"]["precision"] = {"b_crit_ratio": 3, "max_trials": 2}
    with pytest.raises((InvalidInput, ValueError), match="max_trials"):
        parse_spec(d)
    d["search"]["precision"] = {"b_crit_ratio": 3}
    d["pruning"] = {"enabled": True, "mode": "pause"}
    with pytest.raises((InvalidInput, ValueError), match="precision"):
        parse_spec(d)
    d["pruning"] = {"enabled": True, "mode": "stop"}
    spec = parse_spec(d)
    assert spec.max_trials == 2 * spec.n_trials
    plain = copy.deepcopy(tiny_spec_dict)
    assert "precision" not in parse_spec(plain).model_dump(mode="json")["search"]  # fingerprints as before


def test_a_sweep_adds_waves_until_the_interval_is_as_narrow_as_asked(tiny_spec_dict, tmp_path):
    spec = _spec(tiny_spec_dict, precision={"b_crit_ratio": 1.6, "max_trials": 30, "trials_per_wave": 2})
    sim = _SimulatedSweep(spec, BatchSizeSearcher(spec, f"sqlite:///{tmp_path / 'o.db'}", "p"))
    sim.run()
    waves, outcome, planned, targets = sim.reports[-1]
    assert len(waves) >= 2 and outcome is not None
    # the first wave declared the targets; every later wave is judged at one of those same losses
    assert targets and all(r[3] == targets for r in sim.reports)
    assert all(w["target_loss"] in targets for w in waves)
    assert [w["trials"] for w in waves] == sorted(w["trials"] for w in waves)  # each wave after the previous one
    assert waves[0]["trials"] == 10 and planned == len(sim.asked) <= 30
    for w, nxt in zip(waves, waves[1:]):  # each wave added what it said, then the next refit saw them
        assert nxt["trials"] == w["trials"] + sum(1 if a["lr"] is not None else 2 for a in w["added"])
    final = sim.searcher.precision_outcome
    assert final == outcome
    if outcome["stopped_because"] == "met":
        assert outcome["status"] == "ok" and outcome["b_crit_ratio"] <= 1.6
        assert waves[-1]["b_crit_ci"][0] <= B_TRUE * 1.25 and waves[-1]["b_crit_ci"][1] >= B_TRUE / 1.25
    else:
        assert outcome["stopped_because"] in ("max_trials", "nothing_to_add")
    assert waves[-1]["ratio"] is None or waves[0]["ratio"] is None or waves[-1]["ratio"] <= waves[0]["ratio"]


def test_a_wave_counts_the_trials_it_adds_not_its_proposals(tiny_spec_dict, tmp_path):
    """A new batch size is one proposal but ``trials_per_batch_size`` trials: the wave's ``trials_added`` and its
    progress line count what the next wave then finds handed out (the line once said "adding 1 trial(s): B=4"
    before two trials at B=4 ran)."""
    from sweeps.run.progress import wave_line

    spec = _spec(
        tiny_spec_dict,
        precision={"b_crit_ratio": 1.0001, "max_trials": 30, "trials_per_wave": 2, "reallocate_tokens": False},
    )
    sim = _SimulatedSweep(spec, BatchSizeSearcher(spec, f"sqlite:///{tmp_path / 'n.db'}", "n"))
    sim.run()
    waves = sim.reports[-1][0]
    assert any(a["lr"] is None for w in waves for a in w["added"])  # some wave added a new batch size
    for w, nxt in zip(waves, waves[1:]):
        assert w["trials_added"] == nxt["trials"] - w["trials"] > 0
        assert f": adding {w['trials_added']} trial(s): " in wave_line(w, None, 1.0001)
    new_b = next(w for w in waves if any(a["lr"] is None for a in w["added"]))
    assert new_b["trials_added"] > len(new_b["added"])


def test_a_loose_request_still_closes_every_lr_bracket_and_a_cap_stops_the_sweep(tiny_spec_dict, tmp_path):
    """An interval wide enough after the first wave is not ``met`` while a batch size's fastest trial sits at an end
    of its tried LRs (two LRs an octave apart: one end always wins): the waves probe an octave beyond until every
    bracket is closed, then stop. The old rule (70 % of batch sizes at the same end) stopped after 10 trials."""
    loose = _spec(tiny_spec_dict, precision={"b_crit_ratio": 1e5, "max_trials": 40})
    sim = _SimulatedSweep(loose, BatchSizeSearcher(loose, f"sqlite:///{tmp_path / 'a.db'}", "a"))
    sim.run()
    waves, outcome = sim.reports[-1][0], sim.reports[-1][1]
    assert len(sim.asked) > 10 and outcome["stopped_because"] == "met"
    assert waves[0]["lr_brackets_open"] > 0 and waves[-1]["lr_brackets_open"] == 0 and waves[-1]["added"] == []
    added = [a for w in waves for a in w["added"]]
    assert added and all(a["lr"] is not None for a in added) and "probe an octave" in added[0]["reason"]
    tight = _spec(tiny_spec_dict, precision={"b_crit_ratio": 1.0001, "max_trials": 12, "reallocate_tokens": False})
    sim = _SimulatedSweep(tight, BatchSizeSearcher(tight, f"sqlite:///{tmp_path / 'b.db'}", "b"))
    sim.run()
    assert len(sim.asked) == 12 and sim.reports[-1][1]["stopped_because"] in ("max_trials", "nothing_to_add")
    # with token reallocation (the default) the cap counts tokens, in budgets: no trial fits what is left
    tight = _spec(tiny_spec_dict, precision={"b_crit_ratio": 1.0001, "max_trials": 12})
    sim = _SimulatedSweep(tight, BatchSizeSearcher(tight, f"sqlite:///{tmp_path / 'c.db'}", "c"))
    sim.run()
    spent = sum(max(r.tokens) for r in sim.records.values()) / tight.budget_tokens
    assert 11 <= spent <= 12 and sim.reports[-1][1]["stopped_because"] == "max_trials"
    assert sim.reports[-1][0][-1]["budgets_spent"] == pytest.approx(spent)


def test_a_sweep_restored_mid_way_asks_and_answers_as_the_uninterrupted_one(tiny_spec_dict, tmp_path):
    spec = _spec(tiny_spec_dict, precision={"b_crit_ratio": 1.6, "max_trials": 20})
    whole = _SimulatedSweep(spec, BatchSizeSearcher(spec, f"sqlite:///{tmp_path / 'w.db'}", "w"))
    whole.run()

    part = _SimulatedSweep(spec, BatchSizeSearcher(spec, f"sqlite:///{tmp_path / 'r.db'}", "w"))
    while len(part.reports) < 1:  # through the first wave's decision
        assert part.step()
    part.searcher.save(str(tmp_path / "searcher.pkl"))
    fresh = BatchSizeSearcher(spec, f"sqlite:///{tmp_path / 'r.db'}", "w")
    fresh.restore(str(tmp_path / "searcher.pkl"))
    part.attach(fresh)
    part.run()
    assert [(b, pytest.approx(lr)) for _, b, lr in part.asked] == [(b, lr) for _, b, lr in whole.asked]
    assert part.reports[-1][1] == whole.reports[-1][1]
    assert fresh.waves == whole.searcher.waves


def test_independent_studies_take_waves_too(tiny_spec_dict, tmp_path):
    spec = _spec(tiny_spec_dict, strategy="independent", precision={"b_crit_ratio": 1.0001, "max_trials": 14})
    sim = _SimulatedSweep(spec, BatchSizeSearcher(spec, f"sqlite:///{tmp_path / 'i.db'}", "i"))
    sim.run()
    assert len(sim.asked) == 14 and len(sim.reports) >= 2
    added = [a for w in sim.reports[-1][0] for a in w["added"]]
    assert added and all(a["batch_size_sequences"] in dict.fromkeys(b for _, b, _ in sim.asked) for a in added)
    # no LR probes: a batch size's LRs are its study's to sample, so a wave adds batch sizes only
    assert all(a["lr"] is None for a in added)
    assert len({b for _, b, _ in sim.asked}) > 5


def test_a_failing_analysis_ends_the_waves_not_the_sweep(tiny_spec_dict, tmp_path):
    spec = _spec(tiny_spec_dict, precision={"b_crit_ratio": 2})
    sim = _SimulatedSweep(spec, BatchSizeSearcher(spec, f"sqlite:///{tmp_path / 'f.db'}", "f"))

    def broken(targets):
        raise RuntimeError("an analysis bug")

    sim.searcher.attach_precision(broken, lambda *a: sim.reports.append(a))
    sim.run()
    assert len(sim.asked) == 10 and sim.searcher.precision_outcome["stopped_because"] == "analysis_failed"
    assert sim.reports[-1][1]["stopped_because"] == "analysis_failed"


def test_token_reallocation_ends_later_trials_at_the_lowest_target_and_reruns_a_censored_batch_size(
    tiny_spec_dict, tmp_path
):
    spec = _spec(tiny_spec_dict, precision={"b_crit_ratio": 1.0001, "max_trials": 24})
    sim = _SimulatedSweep(spec, BatchSizeSearcher(spec, f"sqlite:///{tmp_path / 'r.db'}", "r"))
    sim.run()
    waves, outcome, _, targets = sim.reports[-1]
    lowest, ids = min(targets), [t for t, _, _ in sim.asked]
    first, later = ids[:10], ids[10:]
    assert later and all("stop_at_loss" not in sim.configs[t] and "budget_tokens" not in sim.configs[t] for t in first)
    assert all(sim.configs[t]["stop_at_loss"] == lowest for t in later)
    for t in later:  # each ended at its first milestone at or below the lowest target, or at its budget
        r = sim.records[t]
        assert all(x > lowest for x in r.val_loss[:-1])
        assert r.val_loss[-1] <= lowest or max(r.tokens) == sim.configs[t].get("budget_tokens", spec.budget_tokens)
    reruns = [t for t in later if "budget_tokens" in sim.configs[t]]
    assert reruns, "the largest batch size, censored at the lowest target, was not re-run"
    t = reruns[0]
    b = sim.records[t].batch_size_sequences
    assert sim.configs[t]["budget_tokens"] == 2 * spec.budget_tokens
    before = analyze_trials(
        [sim.records[i] for i in first],
        context_length_tokens=spec.model.context_length_tokens,
        reference_batch=16.0,
        targets=[lowest],
    )
    assert b in {c["batch_size_sequences"] for c in before["censored_points"]}
    best = min(
        (sim.records[i] for i in first if sim.records[i].batch_size_sequences == b), key=lambda r: r.val_loss[-1]
    )
    assert sim.configs[t]["lr"] == pytest.approx(best.hyperparameters["lr"])  # its best trial's LR, the same curve
    assert sim.records[t].val_loss[:16] == pytest.approx(best.val_loss)
    final = analyze_trials(
        list(sim.records.values()),
        context_length_tokens=spec.model.context_length_tokens,
        reference_batch=16.0,
        targets=[lowest],
    )
    assert b in final["fitted_batch_sizes"] and b not in {c["batch_size_sequences"] for c in final["censored_points"]}
    spent = sum(max(r.tokens) for r in sim.records.values()) / spec.budget_tokens
    assert spent <= 24 + 1e-9 and waves[-1]["budgets_spent"] == pytest.approx(spent)
    assert any(a["budget_multiple"] == 2 for w in waves for a in w["added"])
    # before its tokens were doubled, the censored batch size's best LR had tried LRs on both sides (a probe
    # beyond an end of its tried LRs comes first: a poor LR may be what kept it short)
    before_rerun = [sim.records[i] for i in ids[: ids.index(t)] if sim.records[i].batch_size_sequences == b]
    lrs = sorted({r.hyperparameters["lr"] for r in before_rerun})
    assert lrs[0] < sim.configs[t]["lr"] < lrs[-1]


def test_rule_2_reruns_censored_batch_sizes_nearest_the_knee_first_with_twice_their_tokens(tiny_spec_dict):
    spec = _spec(tiny_spec_dict)
    rows = [(8, 1.4e-3, 1.0), (16, 2e-3, 1.0), (32, 2.8e-3, 1.0), (64, 4e-3, 1.0), (64, 2e-3, 1.3), (128, 5.6e-3, 1.0)]
    trials = _records(rows, spec)
    # the knee near 96: B = 128 nearer than 64 (a censored batch size far past the knee informs the fit least)
    analysis = {
        "b_crit": 96.0,
        "targets": [
            {"target_loss": 3.0, "censored_points": [{"batch_size_sequences": 64}, {"batch_size_sequences": 128}]}
        ],
    }
    r = Reallocation(lowest_target=3.0, budget_tokens=spec.budget_tokens, max_budget_multiple=4)
    # first an LR probe where the best trial ran at an end of its batch size's tried LRs: an octave beyond it
    probes = propose(analysis, trials, 10, allowed_batch_size=lambda b: False, reallocation=r)
    assert [(p.batch_size_sequences, p.budget_multiple) for p in probes[:2]] == [(128, 1), (64, 1)]
    assert [p.lr for p in probes[:2]] == pytest.approx([11.2e-3, 8e-3]) and "before more tokens" in probes[1].reason
    # with slower LRs tried on both sides of the best, the best trial is re-run with twice the tokens
    trials = trials + [
        dataclasses.replace(t, trial_id=f"c{i}", group_id=f"c{i}")
        for i, t in enumerate(_records([(64, 8e-3, 1.2), (128, 11.2e-3, 1.2), (128, 2.8e-3, 1.2)], spec))
    ]
    out = propose(analysis, trials, 10, allowed_batch_size=lambda b: False, reallocation=r)
    assert [(p.batch_size_sequences, p.budget_multiple) for p in out[:2]] == [(128, 2), (64, 2)]
    assert out[1].lr == pytest.approx(4e-3)  # the trial with the lower last loss
    # under independent studies a batch size's LRs are its study's to sample: no re-run at a chosen LR
    assert all(
        p.budget_multiple == 1
        for p in propose(analysis, trials, 10, allowed_batch_size=lambda b: False, reallocation=r, lr_probes=False)
    )
    # a batch size that already ran twice the budget gets four; one that ran four gets no more (max 4)
    others = [t for t in trials if t.trial_id != "r5"]  # B = 128's trial at 5.6e-3 ran again, longer:
    long = others + [
        TrialRecord(
            trial_id="x",
            batch_size_sequences=128,
            seed=0,
            group_id="x",
            status="COMPLETED",
            hyperparameters={"lr": 5.6e-3},
            tokens=[float(spec.budget_tokens) * 2],
            val_loss=[2.5],
        )
    ]
    assert [
        (p.batch_size_sequences, p.budget_multiple)
        for p in propose(analysis, long, 10, allowed_batch_size=lambda b: False, reallocation=r)[:2]
    ] == [(128, 4), (64, 2)]
    longer = others + [
        TrialRecord(
            trial_id="x",
            batch_size_sequences=128,
            seed=0,
            group_id="x",
            status="COMPLETED",
            hyperparameters={"lr": 5.6e-3},
            tokens=[float(spec.budget_tokens) * 4],
            val_loss=[2.5],
        )
    ]
    assert [
        p.batch_size_sequences
        for p in propose(analysis, longer, 10, allowed_batch_size=lambda b: False, reallocation=r)
        if p.budget_multiple > 1
    ] == [64]
    diverged = [t for t in trials if t.batch_size_sequences != 128] + [
        TrialRecord(
            trial_id="d",
            batch_size_sequences=128,
            seed=0,
            group_id="d",
            status="DIVERGED",
            hyperparameters={"lr": 1.0},
            tokens=[1024.0],
            val_loss=[math.nan],
        )
    ]
    assert [
        p.batch_size_sequences
        for p in propose(analysis, diverged, 10, allowed_batch_size=lambda b: False, reallocation=r)
        if p.budget_multiple > 1
    ] == [64]


def test_bracket_probes_and_reruns_alternate_and_a_probe_stops_where_its_bracket_is_open(tiny_spec_dict):
    """A wave interleaves the two things that matter on real training: an LR probe beyond an open bracket (bias) and
    a longer run of the censored batch size nearest the knee (a point instead of a bound). A probe of a bracket open
    only at the higher targets ends at the lowest of those, not at the sweep's lowest target."""
    spec = _spec(tiny_spec_dict)
    rows = [
        (8, 1e-3, 1.3),
        (8, 2e-3, 1.0),
        (16, 1e-3, 1.3),
        (16, 2e-3, 1.0),
        (64, 2e-3, 1.2),
        (64, 4e-3, 1.0),
        (64, 8e-3, 1.2),
    ]
    trials = _records(rows, spec)
    analysis = {
        "b_crit": 24.0,
        "status": "ok",
        "b_crit_ci": [10.0, 60.0],
        "fitted_batch_sizes": [8.0, 16.0],
        "target_loss": 3.0,
        "lr_brackets_open": [
            {"batch_size_sequences": 16, "side": "above", "fastest_lr": 2e-3, "targets": [3.2, 3.1]},
            {"batch_size_sequences": 8, "side": "above", "fastest_lr": 2e-3, "targets": [3.2]},
        ],
        "targets": [{"target_loss": 3.0, "censored_points": [{"batch_size_sequences": 64}]}],
    }
    r = Reallocation(lowest_target=3.0, budget_tokens=spec.budget_tokens, max_budget_multiple=4)
    out = propose(analysis, trials, 10, allowed_batch_size=lambda b: False, reallocation=r)
    kinds = [
        (
            "probe"
            if "probe an octave above" in p.reason and p.budget_multiple == 1 and p.batch_size_sequences != 64
            else "rerun"
        )
        for p in out[:3]
    ]
    assert kinds == ["probe", "rerun", "probe"]
    assert (out[0].batch_size_sequences, out[0].stop_at_loss) == (16, 3.1)  # nearest the knee, ends at 3.1
    assert (out[2].batch_size_sequences, out[2].stop_at_loss) == (8, 3.2)
    assert out[1].batch_size_sequences == 64 and out[1].budget_multiple == 2 and out[1].stop_at_loss is None


def test_cbs_json_keeps_the_last_waves_trials_added(tiny_spec_dict, tmp_path):
    """``cbs.json``'s last wave is refitted from the final analysis; the trials its decision added stay with it."""
    import json

    from sweeps.run.finish import PRECISION_FILE, _precision_section
    from sweeps.spec.result import CbsResult

    spec = _spec(tiny_spec_dict, precision={"b_crit_ratio": 1.6, "max_trials": 30, "reallocate_tokens": False})
    wave = {
        "trials": 3,
        "b_crit": None,
        "b_crit_ci": None,
        "ratio": None,
        "status": "edge",
        "added": [{"batch_size_sequences": 128, "lr": None, "reason": "r", "budget_multiple": 1, "stop_at_loss": None}],
        "trials_added": 2,
    }
    (tmp_path / PRECISION_FILE).write_text(json.dumps({"waves": [wave], "outcome": None, "targets": None}))
    analysis = CbsResult(status="no_targets", b_crit=None, b_crit_ci=None, targets=[])
    section = _precision_section(spec, tmp_path, [object()] * 3, analysis, stopped=True, budget_note="")
    assert section["waves"][-1]["trials_added"] == 2 and section["waves"][-1]["added"] == wave["added"]
    assert section["stopped_because"] == "interrupted"


class _FailingSweep(_SimulatedSweep):
    """Every trial ends without completing: ``FAILED`` (an error before its first report) or ``DIVERGED`` (a
    non-finite loss at its first milestone), as Tune tells the searcher of each."""

    def __init__(self, spec, searcher: BatchSizeSearcher, status: str):
        self.status = status
        super().__init__(spec, searcher)

    def _run(self, batch) -> None:
        for tid, cfg in batch:
            b, lr = int(cfg["batch_size_sequences"]), float(cfg["lr"])
            diverged = self.status == "DIVERGED"
            first = float(self.spec.milestones_tokens()[0])
            self.records[tid] = TrialRecord(
                trial_id=tid,
                batch_size_sequences=b,
                seed=0,
                group_id=tid,
                status=self.status,
                hyperparameters={"lr": lr},
                tokens=[first] if diverged else [],
                val_loss=[math.nan] if diverged else [],
            )
            self.asked.append((tid, b, lr))
            self.configs[tid] = cfg
            if diverged:
                self.searcher.on_trial_complete(tid, {OBJECTIVE: math.inf})
            else:
                self.searcher.on_trial_complete(tid, None, error=True)


@pytest.mark.parametrize("strategy", ["transfer", "independent"])
@pytest.mark.parametrize("status", ["FAILED", "DIVERGED"])
def test_no_wave_is_added_after_a_first_wave_in_which_no_trial_completed(tiny_spec_dict, tmp_path, strategy, status):
    """With nothing measured there is no fit, and "no fit yet: widen the range" added batch sizes, wave after wave,
    that failed as the planned ones did, until max_trials. Now the waves stop after the first: no_trial_completed."""
    spec = _spec(tiny_spec_dict, strategy=strategy, precision={"b_crit_ratio": 2, "max_trials": 40})
    sim = _FailingSweep(spec, BatchSizeSearcher(spec, f"sqlite:///{tmp_path / 'x.db'}", "x"), status)
    sim.run()
    assert len(sim.asked) == spec.n_trials == 10
    assert sim.searcher.precision_outcome["stopped_because"] == "no_trial_completed"
    waves, outcome = sim.reports[-1][0], sim.reports[-1][1]
    assert len(sim.reports) == 1 and outcome == sim.searcher.precision_outcome
    assert len(waves) == 1 and waves[0]["added"] == [] and waves[0]["trials_added"] == 0


def test_the_wave_line_says_no_trial_completed():
    from sweeps.run.progress import wave_line

    wave = {"trials": 10, "b_crit": None, "b_crit_ci": None, "ratio": None, "status": "no_data", "added": []}
    line = wave_line(wave, {"stopped_because": "no_trial_completed"}, 2.0)
    assert line.endswith(": no trial completed, no more trials"), line
