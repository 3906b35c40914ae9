"""Equal-compute early stopping: rungs in FLOPs, interpolated rung values, one batch size at a time.

Synthetic loss curves, reported at different cadences, driven through the scheduler's Tune
interface (``on_trial_result`` with a stand-in trial: the scheduler reads ``trial_id`` and
``config`` only).
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
from ray.tune.schedulers import TrialScheduler

from sweeps.pruning.rungs import RungDecision, curve_at, interpolate, predict_final_log_linear, rung_fractions
from sweeps.pruning.scheduler import EqualComputeScheduler
from sweeps.spec import parse_spec

BUDGET_TOKENS = 100_000
C_TOK = 1.0e6  # FLOPs per token of the synthetic model
BUDGET_FLOPS = BUDGET_TOKENS * C_TOK


def make_scheduler(**kw) -> EqualComputeScheduler:
    kw = {
        "budget_tokens": BUDGET_TOKENS,
        "grace_fraction": 0.25,
        "reduction_factor": 2.0,
        "min_trials_per_rung": 2,
    } | kw
    s = EqualComputeScheduler(**kw)
    s.annotator().setup()
    return s


def trial(tid: str, batch: int):
    return SimpleNamespace(trial_id=tid, config={"batch_size_sequences": batch})


def curve(a: float, b: float):
    """A smooth power-law loss curve in the fraction of the budget trained."""
    return lambda f: a + b * f**-0.5


def cadence(n: int) -> list[float]:
    """``n`` reports evenly spaced in tokens, the last at the budget."""
    return [(i + 1) / n for i in range(n)]


def random_cadence(rng: random.Random) -> list[float]:
    """Irregular reports: 3 to 40 points at random fractions, the first before the first rung
    (as a sweep's first milestone is), the last at the budget."""
    pts = sorted(rng.uniform(0.2, 0.99) for _ in range(rng.randint(1, 38)))
    return [rng.uniform(0.01, 0.2)] + pts + [1.0]


def feed(s: EqualComputeScheduler, t, loss, fractions) -> tuple[str, float, dict]:
    """Report ``loss(f)`` at each fraction until the scheduler stops the trial.

    Returns (last decision, fraction of the budget trained, last result dict)."""
    result: dict = {}
    for f in fractions:
        tokens = f * BUDGET_TOKENS
        result = {"tokens_seen": tokens, "flops": C_TOK * tokens, "val_loss": loss(f)}
        if s.on_trial_result(None, t, result) == TrialScheduler.STOP:
            return TrialScheduler.STOP, f, result
    return TrialScheduler.CONTINUE, fractions[-1], result


def outcomes(s: EqualComputeScheduler, tids) -> dict[str, list[tuple[int, bool]]]:
    return {tid: [(d.rung, d.stop) for d in s.decisions(tid)] for tid in tids}


def line(a: float, b: float):
    """A loss curve linear in compute: linear interpolation is exact at any cadence."""
    return lambda f: a - b * f


# A batch size's LR search, in arrival order: six configurations whose curves cross (the fast starter
# is not the best at the end), so where each is compared matters. Hand-computed outcomes
# (rungs at 0.25 and 0.5 of the budget; reduction factor 2; 2 values needed to stop anyone):
LINES = {
    "first": line(2.20, 0.5),  # r0 2.075, r1 1.95: alone at each rung, continues
    "fast": line(2.00, 0.2),  # r0 1.95 (best of 2), r1 1.90 (best of 2): continues
    "steep": line(2.35, 0.9),  # r0 2.125: 2 of 3 better, keep 2: stopped at r0 (it would have ended best)
    "good": line(2.10, 0.5),  # r0 1.975: 1 of 4 better; r1 1.85: best of 3: continues
    "bad": line(2.50, 0.3),  # r0 2.425: 4 of 5 better, keep 3: stopped at r0
    "late": line(2.16, 0.5),  # r0 2.035: 2 of 6 better, keep 3; r1 1.91: 2 of 4 better, keep 2: stopped at r1
}
EXPECTED = {
    "first": [(0, False), (1, False)],
    "fast": [(0, False), (1, False)],
    "steep": [(0, True)],
    "good": [(0, False), (1, False)],
    "bad": [(0, True)],
    "late": [(0, False), (1, True)],
}

# Smooth power-law curves, well separated at the rungs (for realistic milestone cadences).
SMOOTH = {
    "mid": curve(1.40, 0.35),
    "best": curve(1.10, 0.45),
    "big": curve(1.30, 0.30),
    "small": curve(1.00, 0.62),
    "bad": curve(1.60, 0.50),
    "worse": curve(1.80, 0.50),
}


# ---- pure pieces ------------------------------------------------------------------------------------


def test_rung_fractions_hand_values():
    assert rung_fractions(0.25, 2.0) == [0.25, 0.5]
    assert rung_fractions(0.1, 3.0) == pytest.approx([0.1, 0.3, 0.9])
    assert rung_fractions(0.5, 2.0) == [0.5]
    with pytest.raises(ValueError):
        rung_fractions(0.25, 1.0)


def test_interpolate_hand_value_and_divergence():
    # between (2e12, 3.0) and (4e12, 2.0), at 2.5e12: 3.0 - 0.25 * 1.0
    assert interpolate(2e12, 3.0, 4e12, 2.0, 2.5e12) == pytest.approx(2.75)
    assert interpolate(2e12, 3.0, 4e12, 2.0, 4e12) == 2.0
    assert interpolate(2e12, 3.0, 4e12, math.nan, 3e12) == math.inf


def test_rungs_are_in_flops_of_the_trial_budget():
    s = make_scheduler()
    assert s.rung_flops(C_TOK) == [0.25 * BUDGET_FLOPS, 0.5 * BUDGET_FLOPS]


def test_from_spec_reads_the_pruning_section(tiny_spec_dict):
    d = tiny_spec_dict | {
        "pruning": {"enabled": True, "grace_fraction": 0.125, "reduction_factor": 3, "min_trials_per_rung": 3}
    }
    s = EqualComputeScheduler.from_spec(parse_spec(d))
    assert s.budget_tokens == 8192 and s.min_trials_per_rung == 3 and s.reduction_factor == 3.0
    assert s.fractions == pytest.approx([0.125, 0.375])


# ---- the decision rule --------------------------------------------------------------------------------


def test_rung_value_is_interpolated_between_the_bracketing_reports():
    s = make_scheduler()
    feed(s, trial("a", 8), lambda f: 3.0 - f, [0.2, 0.3])  # rung 0 at 0.25: 3.0 - 0.25
    (d,) = s.decisions("a")
    assert d == RungDecision(
        rung=0, flops=0.25 * BUDGET_FLOPS, value=pytest.approx(2.75), better=0, peers=1, keep=1, stop=False
    )


def test_decision_waits_for_a_report_at_or_past_the_rung():
    s = make_scheduler()
    feed(s, trial("a", 8), lambda f: 2.0, [0.1, 0.2, 0.2499])
    assert s.decisions("a") == []
    feed(s, trial("a", 8), lambda f: 2.0, [0.25])
    assert [d.rung for d in s.decisions("a")] == [0]


def test_one_report_past_two_rungs_decides_both():
    s = make_scheduler()
    feed(s, trial("a", 8), lambda f: 3.0 - f, [0.2, 0.6])
    assert [(d.rung, round(d.value, 6)) for d in s.decisions("a")] == [(0, 2.75), (1, 2.5)]


def test_rung_before_the_first_report_is_skipped():
    s = make_scheduler()
    feed(s, trial("a", 8), lambda f: 2.0, [0.3, 0.6])
    assert [d.rung for d in s.decisions("a")] == [1]


def test_top_one_over_reduction_factor_continues_once_enough_peers():
    s = make_scheduler(min_trials_per_rung=3)
    # same batch size, arriving one after the other; losses at rung 0: 2.0, 1.0, 3.0, 1.5
    for tid, loss in [("a", 2.0), ("b", 1.0), ("c", 3.0), ("d", 1.5)]:
        feed(s, trial(tid, 8), lambda f, v=loss: v, [0.25])
    got = {
        tid: (s.decisions(tid)[0].better, s.decisions(tid)[0].peers, s.decisions(tid)[0].keep, s.decisions(tid)[0].stop)
        for tid in "abcd"
    }
    assert got == {
        "a": (0, 1, 1, False),  # alone: fewer than min_trials_per_rung peers
        "b": (0, 2, 2, False),
        "c": (2, 3, 2, True),  # 3 peers: keep ceil(3/2) = 2; two are better
        "d": (1, 4, 2, False),  # 4 peers: keep 2; one is better
    }


def test_first_trial_to_reach_every_rung_runs_its_whole_budget():
    s = make_scheduler()
    for tid, c in LINES.items():
        feed(s, trial(tid, 8), c, cadence(16))
    first = s.decisions("first")
    assert [d.stop for d in first] == [False, False]


def test_pruned_trial_is_annotated_in_the_result_and_by_the_annotator():
    s = make_scheduler()
    feed(s, trial("good", 8), lambda f: 1.0, cadence(8))
    decision, f, flat = feed(s, trial("bad", 8), lambda f: 2.0, cadence(8))
    assert decision == TrialScheduler.STOP and f == 0.25
    assert flat["pruned"] is True and flat["pruned_at_flops"] == 0.25 * BUDGET_FLOPS and flat["pruned_rung"] == 0
    original = {"val_loss": 2.0}
    s.annotator().on_trial_result(0, [], trial("bad", 8), original)
    assert original["pruned"] is True and original["pruned_at_flops"] == 0.25 * BUDGET_FLOPS
    assert original["rung_decisions"] == "r0@2.5e+10:stop(rank 2/2,keep 1)"
    # a trial that continued carries its decisions but no pruning keys
    cont = {}
    s.annotator().on_trial_result(0, [], trial("good", 8), cont)
    assert cont == {"rung_decisions": "r0@2.5e+10:continue(rank 1/1,keep 1);r1@5e+10:continue(rank 1/1,keep 1)"}


def test_diverged_trial_counts_as_worst_value():
    s = make_scheduler()
    feed(s, trial("ok", 8), lambda f: 2.0, cadence(8))
    decision, _, _ = feed(s, trial("nan", 8), lambda f: math.nan if f >= 0.25 else 2.5, cadence(8))
    assert decision == TrialScheduler.STOP
    assert s.decisions("nan")[0].value == math.inf


def test_replayed_reports_are_ignored():
    s = make_scheduler()
    t = trial("a", 8)
    feed(s, t, lambda f: 2.0, [0.125, 0.25])
    feed(s, t, lambda f: 2.0, [0.125, 0.25])  # a restarted worker group reports the same milestones again
    assert [d.rung for d in s.decisions("a")] == [0]


def test_scheduler_refuses_to_run_without_its_annotator():
    s = EqualComputeScheduler(budget_tokens=BUDGET_TOKENS)
    with pytest.raises(RuntimeError, match="annotator"):
        s.on_trial_result(None, trial("a", 8), {"tokens_seen": 1, "flops": 1.0, "val_loss": 1.0})


def test_observe_restores_rung_values_after_a_resume():
    s = make_scheduler()
    tokens = [f * BUDGET_TOKENS for f in cadence(8)]
    s.observe("old", 8, tokens, [C_TOK * t for t in tokens], [1.0] * 8)
    assert s.decisions("old") == []  # observed, not decided
    decision, f, _ = feed(s, trial("new", 8), lambda f: 2.0, cadence(8))
    assert decision == TrialScheduler.STOP and f == 0.25


# ---- the two properties the issue asks for ----------------------------------------------------------------


def test_hand_computed_decisions_at_a_dense_cadence():
    s = make_scheduler()
    for tid, c in LINES.items():
        feed(s, trial(tid, 16), c, cadence(200))
    assert outcomes(s, LINES) == EXPECTED


@pytest.mark.parametrize("seed", range(20))
def test_decisions_do_not_depend_on_the_reporting_cadence(seed):
    """Each trial reports at its own irregular cadence (3 to 40 reports): the same decisions."""
    rng = random.Random(seed)
    s = make_scheduler()
    for tid, c in LINES.items():
        feed(s, trial(tid, 16), c, random_cadence(rng))
    assert outcomes(s, LINES) == EXPECTED


@pytest.mark.parametrize("n", [10, 14, 16, 20, 28, 32])
def test_smooth_curves_decide_alike_at_every_milestone_cadence(n):
    """Curved losses, milestones evenly spaced in tokens as a sweep reports them: the decisions of a
    1000-report reference (interpolation error shrinks as the square of the spacing)."""
    ref = make_scheduler()
    for tid, c in SMOOTH.items():
        feed(ref, trial(tid, 16), c, cadence(1000))
    expected = outcomes(ref, SMOOTH)
    assert any(ds[-1][1] for ds in expected.values()) and sum(not ds[-1][1] for ds in expected.values()) >= 2
    s = make_scheduler()
    for tid, c in SMOOTH.items():
        feed(s, trial(tid, 16), c, cadence(n))
    assert outcomes(s, SMOOTH) == expected


def test_interleaved_trials_with_different_cadences_decide_alike():
    """Trials run at once (staggered starts), each reporting at its own cadence: the same decisions."""
    cadences = [cadence(n) for n in (16, 7, 5, 23, 9, 12)]
    events = []  # (time, trial id, fraction): trial i starts at time i and trains its budget in 4 time units
    for i, (tid, fr) in enumerate(zip(LINES, cadences)):
        events += [(i + 4 * f, tid, f) for f in fr]
    s = make_scheduler()
    stopped: set[str] = set()
    for _, tid, f in sorted(events):
        if tid in stopped:
            continue
        if feed(s, trial(tid, 16), LINES[tid], [f])[0] == TrialScheduler.STOP:
            stopped.add(tid)
    assert outcomes(s, LINES) == EXPECTED


def test_first_report_past_the_rung_would_change_the_decision():
    """Why interpolate: judged at its first report past the rung, a rarely reporting trial is
    compared on more compute than its peer and survives; interpolated, it is pruned either way."""
    dense, sparse = curve(1.2, 0.40), curve(1.25, 0.40)  # 'sparse' is worse at every point
    for fractions in (cadence(64), [0.1, 0.45, 1.0]):
        s = make_scheduler()
        feed(s, trial("dense", 8), dense, cadence(64))
        assert feed(s, trial("sparse", 8), sparse, fractions)[0] == TrialScheduler.STOP
        assert s.decisions("sparse")[0].rung == 0
    # a naive rule reading the value at the first report past the rung (0.25) would keep it:
    naive_sparse_at_rung0 = sparse(0.45)
    naive_dense_at_rung0 = dense(0.25)
    assert naive_sparse_at_rung0 < naive_dense_at_rung0


def test_trials_of_different_batch_sizes_are_never_compared():
    s = make_scheduler()
    # B=8 trials are far better than anything at B=4; a lone B=4 trial must still run its budget
    for tid, loss in [("b8-x", 1.0), ("b8-y", 1.1), ("b8-z", 1.2)]:
        feed(s, trial(tid, 8), lambda f, v=loss: v, cadence(8))
    decision, f, _ = feed(s, trial("b4-a", 4), lambda f: 5.0, cadence(8))
    assert decision == TrialScheduler.CONTINUE and f == 1.0
    assert all(d.peers == 1 for d in s.decisions("b4-a"))
    # a second B=4 trial is compared with the first B=4 trial only
    decision, f, _ = feed(s, trial("b4-b", 4), lambda f: 5.5, cadence(8))
    assert decision == TrialScheduler.STOP and f == 0.25
    assert s.decisions("b4-b")[0].peers == 2
    # and the B=8 rungs never saw a B=4 value
    assert all(d.peers <= 3 for tid in ("b8-x", "b8-y", "b8-z") for d in s.decisions(tid))
    assert s.decisions("b8-z")[0] == RungDecision(
        rung=0, flops=0.25 * BUDGET_FLOPS, value=1.2, better=2, peers=3, keep=2, stop=True
    )


def test_every_batch_size_keeps_a_trial_that_completes():
    """Whatever the arrival order and cadence, each batch size has one trial that is never stopped."""
    rng = random.Random(7)
    s = make_scheduler()
    finished: dict[int, int] = {}
    for b in (4, 8, 16, 32):
        names = list(SMOOTH)
        rng.shuffle(names)
        for tid in names:
            decision, f, _ = feed(s, trial(f"{b}-{tid}", b), SMOOTH[tid], random_cadence(rng))
            if decision == TrialScheduler.CONTINUE:
                finished[b] = finished.get(b, 0) + 1
    assert set(finished) == {4, 8, 16, 32}


# ---- the predicted_final rule and the margin ----------------------------------------------------------------

# The same six lines judged on their predicted loss at the budget (``predict_final_log_linear`` through
# the loss at 0.5, 0.75 and 1 of the rung). Hand-computed predictions (rung 0 at 0.25, rung 1 at 0.5):
#   first 1.9532, 1.8303; fast 1.9013, 1.8521; steep 1.9058, 1.6845; good 1.8532, 1.7303; bad 2.3519; late 1.9132
# r0: first alone; fast best of 2; steep 1 better of 3 (keep 2); good best of 4; bad 4 better of 5 (keep 3):
# stopped; late 3 better of 6 (fast, steep, good; keep 3): stopped. r1: first alone; fast 1 better of 2
# (keep 1): stopped; steep best of 3; good 1 better of 4 (keep 2). The steep line, best at the budget
# (1.45) and stopped at r0 by loss_at_rung, now runs its budget.
EXPECTED_PREDICTED = {
    "first": [(0, False), (1, False)],
    "fast": [(0, False), (1, True)],
    "steep": [(0, False), (1, False)],
    "good": [(0, False), (1, False)],
    "bad": [(0, True)],
    "late": [(0, True)],
}


def predicted(**kw) -> EqualComputeScheduler:
    return make_scheduler(rule="predicted_final", **kw)


def early_random_cadence(rng: random.Random) -> list[float]:
    """Irregular reports (3 to 40) whose first lies before the first fit point (0.5 x the first rung)."""
    pts = sorted(rng.uniform(0.12, 0.99) for _ in range(rng.randint(1, 38)))
    return [rng.uniform(0.01, 0.12)] + pts + [1.0]


def test_predict_final_log_linear_hand_values():
    # two points: the line through (ln 0.5, 2.0) and (ln 1, 1.8), at ln 4: 1.8 - 0.2 * ln4 / ln2 = 1.4
    assert predict_final_log_linear([0.5, 1.0], [2.0, 1.8], 4.0) == pytest.approx(1.4)
    # points on L = 3 - 0.5 ln(x): exact at any horizon; the order of the points does not matter
    xs = [0.25, 1.0, 0.5, 0.75]
    assert predict_final_log_linear(xs, [3 - 0.5 * math.log(x) for x in xs], 8.0) == pytest.approx(
        3 - 0.5 * math.log(8)
    )
    # least squares: (ln .5, 1), (ln .75, 0), (0, 1) -> slope 0.3795..., mean; at 1: 2/3 + s * (0 - mean u)
    u = [math.log(0.5), math.log(0.75), 0.0]
    um = sum(u) / 3
    s = sum((x - um) * (y - 2 / 3) for x, y in zip(u, [1, 0, 1])) / sum((x - um) ** 2 for x in u)
    assert predict_final_log_linear([0.5, 0.75, 1.0], [1, 0, 1], 1.0) == pytest.approx(2 / 3 - s * um)
    assert predict_final_log_linear([0.5, 1.0], [2.0, math.nan], 4.0) == math.inf
    with pytest.raises(ValueError):
        predict_final_log_linear([1.0], [2.0], 4.0)
    with pytest.raises(ValueError):
        predict_final_log_linear([1.0, 1.0], [2.0, 1.0], 4.0)


def test_curve_at_interpolates_and_refuses_before_the_first_report():
    pts = [(2.0, 3.0), (4.0, 2.0), (8.0, 1.0)]
    assert curve_at(pts, 1.0) is None
    assert curve_at(pts, 2.0) == 3.0
    assert curve_at(pts, 3.0) == pytest.approx(2.5)
    assert curve_at(pts, 6.0) == pytest.approx(1.5)
    assert curve_at(pts, 8.0) == 1.0
    assert curve_at([(2.0, 3.0), (4.0, math.nan)], 3.0) == math.inf


def test_predicted_value_is_the_extrapolation_of_the_fit_points():
    s = predicted()
    feed(s, trial("a", 8), lambda f: 3.0 - f, [0.1, 0.2, 0.3])
    (d,) = s.decisions("a")
    q = [0.5, 0.75, 1.0]
    assert d.rung == 0 and d.value == pytest.approx(predict_final_log_linear(q, [3.0 - 0.25 * x for x in q], 4.0))


def test_predicted_final_hand_computed_decisions():
    s = predicted()
    for tid, c in LINES.items():
        feed(s, trial(tid, 16), c, cadence(200))
    assert outcomes(s, LINES) == EXPECTED_PREDICTED
    assert s.decisions("steep")[0].value == pytest.approx(1.9058, abs=1e-4)


@pytest.mark.parametrize("seed", range(20))
def test_predicted_final_does_not_depend_on_the_reporting_cadence(seed):
    """Irregular cadences (3 to 40 reports): the fit points are read at fixed fractions of the rung,
    interpolated, so the predictions and the decisions are those of the dense cadence."""
    rng = random.Random(seed)
    s = predicted()
    for tid, c in LINES.items():
        feed(s, trial(tid, 16), c, early_random_cadence(rng))
    assert outcomes(s, LINES) == EXPECTED_PREDICTED
    ref = predicted()
    for tid, c in LINES.items():
        feed(ref, trial(tid, 16), c, cadence(1000))
    for tid in LINES:
        assert [d.value for d in s.decisions(tid)] == pytest.approx([d.value for d in ref.decisions(tid)])


@pytest.mark.parametrize("n", [10, 14, 16, 20, 28, 32])
def test_predicted_final_smooth_curves_decide_alike_at_every_milestone_cadence(n):
    ref = predicted()
    for tid, c in SMOOTH.items():
        feed(ref, trial(tid, 16), c, cadence(1000))
    expected = outcomes(ref, SMOOTH)
    assert any(ds[-1][1] for ds in expected.values())
    s = predicted()
    for tid, c in SMOOTH.items():
        feed(s, trial(tid, 16), c, cadence(n))
    assert outcomes(s, SMOOTH) == expected


def test_predicted_final_skips_a_rung_whose_fit_points_precede_the_first_report():
    s = predicted()
    feed(s, trial("a", 8), lambda f: 3.0 - f, [0.15, 0.3, 0.6])  # rung 0's fit starts at 0.125: skipped
    assert [d.rung for d in s.decisions("a")] == [1]  # rung 1's points (0.25, 0.375, 0.5) are bracketed


def test_predicted_final_compares_only_the_same_batch_size_and_stops_diverged_trials():
    s = predicted()
    feed(s, trial("b8", 8), lambda f: 1.0 - 0.1 * f, cadence(16))
    decision, f, _ = feed(s, trial("b4", 4), lambda f: 4.0 - 0.1 * f, cadence(16))
    assert decision == TrialScheduler.CONTINUE and f == 1.0
    decision, f, _ = feed(s, trial("nan", 4), lambda f: math.nan if f > 0.2 else 3.0, cadence(16))
    assert decision == TrialScheduler.STOP and f == 0.25 and s.decisions("nan")[0].value == math.inf


def test_margin_keeps_the_values_close_to_the_best():
    s = make_scheduler(margin=0.25)  # binary-exact values: the boundary case is exact
    for tid, loss in [("a", 3.0), ("b", 1.0), ("c", 1.125), ("d", 1.5), ("e", 1.25)]:
        feed(s, trial(tid, 8), lambda f, v=loss: v, [0.25])
    got = {
        tid: (s.decisions(tid)[0].better, s.decisions(tid)[0].peers, s.decisions(tid)[0].keep, s.decisions(tid)[0].stop)
        for tid in "abcde"
    }
    assert got == {
        "a": (0, 1, 1, False),  # alone
        "b": (0, 2, 1, False),  # the best; a (3.0) is not within 0.25 of it: keep 1
        "c": (1, 3, 2, False),  # within 0.25 of the best (1.0): b and c are kept
        "d": (2, 4, 2, True),  # 0.5 behind: stopped
        "e": (2, 5, 3, False),  # exactly at best + margin: kept
    }


def test_margin_zero_keeps_only_the_best_so_far():
    s = make_scheduler(margin=0.0)
    stops = [
        feed(s, trial(t, 8), lambda f, v=v: v, [0.25])[0] for t, v in [("a", 2.0), ("b", 1.5), ("c", 1.6), ("d", 1.4)]
    ]
    assert stops == [TrialScheduler.CONTINUE, TrialScheduler.CONTINUE, TrialScheduler.STOP, TrialScheduler.CONTINUE]


def test_from_spec_reads_the_rule_fit_fractions_and_margin(tiny_spec_dict):
    d = tiny_spec_dict | {
        "pruning": {"enabled": True, "rule": "predicted_final", "fit_fractions": [1.0, 0.25, 0.5], "margin": 0.02}
    }
    s = EqualComputeScheduler.from_spec(parse_spec(d))
    assert s.rule == "predicted_final" and s.fit_fractions == (0.25, 0.5, 1.0) and s.margin == 0.02
    default = EqualComputeScheduler.from_spec(parse_spec(tiny_spec_dict | {"pruning": {"enabled": True}}))
    assert default.rule == "predicted_final" and default.margin is None  # the spec default


@pytest.mark.parametrize(
    "bad",
    [
        {"rule": "median"},
        {"fit_fractions": [0.5, 0.5]},
        {"fit_fractions": [1.0]},
        {"fit_fractions": [0.0, 1.0]},
        {"fit_fractions": [0.5, 1.5]},
        {"margin": -0.1},
    ],
)
def test_spec_rejects_bad_pruning_rules(tiny_spec_dict, bad):
    from sweeps.spec import SpecError

    with pytest.raises((SpecError, ValueError)):
        parse_spec(tiny_spec_dict | {"pruning": {"enabled": True, **bad}})


def test_scheduler_rejects_bad_rule_arguments():
    with pytest.raises(ValueError):
        make_scheduler(rule="median")
    with pytest.raises(ValueError):
        make_scheduler(fit_fractions=(0.5, 0.5))
    with pytest.raises(ValueError):
        make_scheduler(margin=-1.0)


# ---- mode "pause": each rung waits for the whole batch size ----------------------------------------------


def make_pause_scheduler(n_per_group: int, **kw) -> EqualComputeScheduler:
    return make_scheduler(mode="pause", trials_per_group=n_per_group, max_concurrent=kw.pop("max_concurrent", 2), **kw)


class PausedSweep:
    """Drives ``trials`` (``(id, batch, loss(f), report fractions)``, started in list order, ``concurrency``
    running at a time, all at the same speed) the way Tune does in mode "pause": a paused trial frees
    its slot, promoted trials resume first, pruned paused trials end. Each report is a checkpoint."""

    def __init__(self, s: EqualComputeScheduler, trials, concurrency: int):
        self.s = s
        self.spec = {tid: (b, loss, fr) for tid, b, loss, fr in trials}
        self.queue = [tid for tid, *_ in trials]
        self.concurrency = concurrency
        for tid, b, *_ in trials:
            s.add_member(tid, b)  # Tune adds each trial as the searcher creates it
        self.nxt = {tid: 0 for tid in self.spec}
        self.start: dict[str, float] = {}
        self.trained: dict[str, float] = {}  # ended trials: the budget fraction each trained
        self.pruned: dict[str, dict] = {}  # pruned trials: the annotation of their last result
        self.events: list = []
        self.running: set[str] = set()
        self.now = 0.0
        self.fail_at: dict[str, int] = {}  # trial id -> the report at which it fails instead (Tune: ERROR)
        self.failed: set[str] = set()

    def launch(self, tid: str) -> None:
        import heapq

        fr = self.spec[tid][2]
        self.start[tid] = self.now - (fr[self.nxt[tid] - 1] if self.nxt[tid] else 0.0)
        self.running.add(tid)
        heapq.heappush(self.events, (self.start[tid] + fr[self.nxt[tid]], tid))

    def fill(self) -> None:
        s = self.s
        while s.to_prune:
            tid = s.to_prune.pop(0)
            self.trained[tid] = self.spec[tid][2][self.nxt[tid] - 1]
            self.pruned[tid] = s.pruned_while_paused[tid]
        while len(self.running) < self.concurrency and (s.to_resume or self.queue):
            self.launch(s.to_resume.pop(0) if s.to_resume else self.queue.pop(0))

    def run(self, max_reports: int | None = None) -> dict[str, float]:
        """Run until every trial ended (or ``max_reports`` reports: the driver dies); returns :attr:`trained`."""
        import heapq

        s = self.s
        self.fill()
        n = 0
        while (self.events or s.waiting) and (max_reports is None or n < max_reports):
            assert n < 10_000, "the sweep does not end"
            if not self.events:
                assert s.force_lowest(), "trials wait for nothing"
                self.fill()
                continue
            self.now, tid = heapq.heappop(self.events)
            b, loss, fr = self.spec[tid]
            if self.fail_at.get(tid) == self.nxt[tid]:
                del self.fail_at[tid]
                self.running.discard(tid)
                self.failed.add(tid)
                self.trained[tid] = fr[self.nxt[tid] - 1] if self.nxt[tid] else 0.0
                s.end(tid)
                self.fill()
                continue
            f = fr[self.nxt[tid]]
            self.nxt[tid] += 1
            n += 1
            what = s.report(tid, b, C_TOK * f * BUDGET_TOKENS, f * BUDGET_TOKENS, loss(f))
            if what in ("stop", "pause") or self.nxt[tid] == len(fr):
                self.running.discard(tid)
                if what != "pause":
                    self.trained[tid] = f
                    if what == "continue":
                        s.end(tid)
                    else:
                        self.pruned[tid] = s.annotation(tid)
            else:
                heapq.heappush(self.events, (self.start[tid] + fr[self.nxt[tid]], tid))
            self.fill()
        return self.trained

    def resume(self, s2: EqualComputeScheduler) -> PausedSweep:
        """The driver died: a new scheduler learns the sweep from the trials' reports (as the driver's
        ``critbatch resume`` does); Tune restarts every unfinished trial the scheduler does not hold."""
        for tid, (b, loss, fr) in self.spec.items():
            done = fr[: self.nxt[tid]]
            s2.observe(
                tid,
                b,
                [f * BUDGET_TOKENS for f in done],
                [C_TOK * f * BUDGET_TOKENS for f in done],
                [loss(f) for f in done],
                ended=tid in self.trained,
                pruning=self.pruned.get(tid),
            )
        s2.restore_decisions()
        for tid in self.failed:  # Tune.restore(resume_errored=True) retries the failed trials
            s2.reopen(tid)
        new = PausedSweep.__new__(PausedSweep)
        new.__dict__.update(
            self.__dict__,
            s=s2,
            events=[],
            running=set(),
            failed=set(),
            fail_at={},
            trained={t: f for t, f in self.trained.items() if t not in self.failed},
            pruned=dict(self.pruned),
        )
        started = [tid for tid in self.spec if tid not in self.queue]
        new.queue = [t for t in started if t not in new.trained and not s2.held(t)] + list(self.queue)
        return new


def run_paused(s: EqualComputeScheduler, trials, concurrency: int = 2) -> dict[str, float]:
    """:class:`PausedSweep` to the end; returns the budget fraction each trial trained."""
    return PausedSweep(s, trials, concurrency).run()


def test_pause_waits_for_every_trial_of_the_batch_size_then_decides_the_rung_at_once():
    s = make_pause_scheduler(4)
    ids = ["a", "b", "c", "d"]
    for tid in ids:
        s.add_member(tid, 8)
    levels = {"a": 2.3, "b": 2.0, "c": 2.2, "d": 2.1}  # final losses: b < d < c < a
    for tid in ids:
        assert s.report(tid, 8, C_TOK * 0.1 * BUDGET_TOKENS, 0.1 * BUDGET_TOKENS, 3.0) == "continue"
    for tid in ids[:3]:
        assert s.report(tid, 8, C_TOK * 0.3 * BUDGET_TOKENS, 0.3 * BUDGET_TOKENS, levels[tid]) == "pause"
    assert s.decisions("a") == [] and set(s.waiting) == {"a", "b", "c"}
    # the last one arrives: the top ceil(4/2) = 2 of all four continue, whatever the arrival order
    assert s.report("d", 8, C_TOK * 0.3 * BUDGET_TOKENS, 0.3 * BUDGET_TOKENS, levels["d"]) == "continue"
    assert s.to_resume == ["b"] and s.to_prune == ["c", "a"] and not s.waiting
    assert outcomes(s, ids) == {"a": [(0, True)], "b": [(0, False)], "c": [(0, True)], "d": [(0, False)]}
    assert [(d.better, d.peers, d.keep) for d in s.decisions("a")] == [(3, 4, 2)]
    assert s.pruned_while_paused["a"]["pruned"] is True and s.pruned_while_paused["a"]["pruned_rung"] == 0


@pytest.mark.parametrize("seed", range(8))
def test_pause_decisions_depend_on_neither_cadence_nor_arrival_order(seed):
    rng = random.Random(seed)
    # crossing curves: who leads early is not who wins; six trials of one batch size
    trials = [(f"t{i}", 16, line(3.0 + 0.1 * i, 0.4 + 0.17 * ((i * 5) % 6)), None) for i in range(6)]
    reference = None
    for _ in range(4):
        order = trials[:]
        rng.shuffle(order)
        s = make_pause_scheduler(6, rule="loss_at_rung")
        # a report between the last rung and the budget (as milestones are): a report that jumps from before
        # a rung to the budget finishes the trial, which then cannot be judged there
        run_paused(
            s,
            [(t, b, loss, sorted(random_cadence(rng) + [rng.uniform(0.51, 0.99)])) for t, b, loss, _ in order],
            concurrency=rng.randint(1, 4),
        )
        got = outcomes(s, [t for t, *_ in trials])
        reference = reference or got
        assert got == reference
    # hand-computed from the lines: the losses at 0.25 rank t3 < t4 < t5 < t0 < t1 < t2... checked by value:
    s_vals = {t: loss(0.25) for t, _, loss, _ in trials}
    top3 = sorted(s_vals, key=s_vals.get)[:3]
    assert {t for t, d in reference.items() if d[0] == (0, False)} == set(top3)


def test_pause_compares_only_trials_of_the_same_batch_size():
    s = make_pause_scheduler(2)
    trials = [
        ("b4-good", 4, line(1.0, 0.1), cadence(8)),
        ("b8-bad", 8, line(9.0, 0.1), cadence(8)),
        ("b4-bad", 4, line(2.0, 0.1), cadence(8)),
        ("b8-worse", 8, line(9.5, 0.1), cadence(8)),
    ]
    trained = run_paused(s, trials)
    # each batch size keeps its own best, however much worse than the other batch size's
    assert trained == {"b4-good": 1.0, "b8-bad": 1.0, "b4-bad": 0.25, "b8-worse": 0.25}
    # the rung-0 decisions count two peers each (its own batch size's), rung 1 only the survivor
    assert [d.peers for d in s.decisions("b4-good")] == [d.peers for d in s.decisions("b8-bad")] == [2, 1]
    assert [d.peers for d in s.decisions("b4-bad")] == [d.peers for d in s.decisions("b8-worse")] == [2]


def test_pause_saves_flops_over_stop_on_the_same_trials():
    """The first trial to reach a rung always continues in mode "stop"; in mode "pause" only the best do."""
    trials = [(f"t{i}", 8, line(3.0 - 0.1 * i, 0.5), cadence(16)) for i in range(4)]  # later = better
    stop = make_scheduler(rule="loss_at_rung")
    spent_stop = 0.0
    for tid, b, loss, fr in trials:
        spent_stop += feed(stop, trial(tid, b), loss, fr)[1]
    trained = run_paused(make_pause_scheduler(4, rule="loss_at_rung"), trials, concurrency=1)
    assert trained == {"t0": 0.25, "t1": 0.25, "t2": 0.5, "t3": 1.0}  # 4 x 0.25, 2 x 0.25 more, 1 x 0.5 more
    assert sum(trained.values()) == 2.0 < spent_stop


def test_pause_a_report_past_two_rungs_waits_at_the_second_after_promotion_without_resuming():
    s = make_pause_scheduler(3)
    for tid in ("coarse", "f1", "f2"):
        s.add_member(tid, 8)
        assert s.report(tid, 8, C_TOK * 0.1 * BUDGET_TOKENS, 0.1 * BUDGET_TOKENS, 3.0) == "continue"
    # "coarse" reports next at 0.6: past both rungs (0.25, 0.5); it waits at rung 0 first
    assert s.report("coarse", 8, C_TOK * 0.6 * BUDGET_TOKENS, 0.6 * BUDGET_TOKENS, 2.0) == "pause"
    assert s.waiting == {"coarse": 0}
    assert s.report("f1", 8, C_TOK * 0.25 * BUDGET_TOKENS, 0.25 * BUDGET_TOKENS, 9.0) == "pause"
    # rung 0 complete: 2.5 (f2) and 2.7 (coarse, interpolated) continue, 9.0 (f1) is pruned where it waits
    assert s.report("f2", 8, C_TOK * 0.25 * BUDGET_TOKENS, 0.25 * BUDGET_TOKENS, 2.5) == "continue"
    assert s.to_prune == ["f1"]
    # promoted, "coarse" already has the report that covers rung 1: it waits there, it is not resumed
    assert s.waiting == {"coarse": 1} and s.to_resume == []
    assert s.report("f2", 8, C_TOK * 0.5 * BUDGET_TOKENS, 0.5 * BUDGET_TOKENS, 2.4) == "stop"  # 2.2 < 2.4
    assert s.to_resume == ["coarse"]
    assert outcomes(s, ["coarse", "f1", "f2"]) == {
        "coarse": [(0, False), (1, False)],
        "f1": [(0, True)],
        "f2": [(0, False), (1, True)],
    }


def test_pause_a_trial_that_reports_its_budget_is_done_not_paused():
    s = make_pause_scheduler(2)
    s.add_member("a", 8)
    s.add_member("b", 8)
    s.report("a", 8, C_TOK * 0.1 * BUDGET_TOKENS, 0.1 * BUDGET_TOKENS, 3.0)
    assert s.report("a", 8, C_TOK * BUDGET_TOKENS, BUDGET_TOKENS, 2.0) == "continue"  # past both rungs, finished
    assert not s.waiting
    s.report("b", 8, C_TOK * 0.1 * BUDGET_TOKENS, 0.1 * BUDGET_TOKENS, 3.0)
    assert s.report("b", 8, C_TOK * 0.25 * BUDGET_TOKENS, 0.25 * BUDGET_TOKENS, 9.0) == "stop"  # a's value counts


def test_pause_trial_that_ends_before_a_rung_does_not_hold_it_up():
    s = make_pause_scheduler(3)
    for tid in ("x", "y", "z"):
        s.add_member(tid, 4)
    assert s.report("x", 4, C_TOK * 0.25 * BUDGET_TOKENS, 0.25 * BUDGET_TOKENS, 2.0) == "pause"
    assert s.report("y", 4, C_TOK * 0.25 * BUDGET_TOKENS, 0.25 * BUDGET_TOKENS, 2.5) == "pause"
    assert s.report("z", 4, C_TOK * 0.1 * BUDGET_TOKENS, 0.1 * BUDGET_TOKENS, float("nan")) == "continue"
    s.end("z")  # diverged before the rung
    assert s.to_resume == ["x"] and s.to_prune == ["y"]


def test_pause_force_lowest_decides_a_rung_that_cannot_complete():
    s = make_pause_scheduler(4)  # 4 expected, only 2 ever come (a searcher that stopped early)
    for tid, v in (("p", 2.0), ("q", 3.0)):
        s.add_member(tid, 4)
        assert s.report(tid, 4, C_TOK * 0.25 * BUDGET_TOKENS, 0.25 * BUDGET_TOKENS, v) == "pause"
    assert s.force_lowest() is True
    assert s.to_resume == ["p"] and s.to_prune == ["q"]
    assert s.force_lowest() is False


def test_pause_may_start_counts_running_trials_only():
    s = make_pause_scheduler(4, max_concurrent=2)
    for tid in ("a", "b"):
        s.add_member(tid, 4)
        s.report(tid, 4, C_TOK * 0.25 * BUDGET_TOKENS, 0.25 * BUDGET_TOKENS, 2.0)
    assert set(s.waiting) == {"a", "b"}
    assert s.may_start(["a", "b"])  # both paused: two slots free
    assert s.may_start(["a", "b", "c"])
    assert not s.may_start(["a", "b", "c", "d"])


def test_pause_mode_from_spec_and_its_arguments(tiny_spec_dict):
    d = tiny_spec_dict | {"pruning": {"enabled": True}, "seeds": [0, 1]}
    d["search"] = d["search"] | {"trials_per_batch_size": 3}
    d["resources"] = {"max_concurrent_trials": 3}
    s = EqualComputeScheduler.from_spec(parse_spec(d))
    assert (s.mode, s.trials_per_group, s.max_concurrent) == ("pause", 6, 3)  # pause is the default
    with pytest.raises(ValueError, match="trials_per_group"):
        EqualComputeScheduler(budget_tokens=10, mode="pause")
    with pytest.raises(ValueError, match="mode"):
        EqualComputeScheduler(budget_tokens=10, mode="wait")


def test_pause_a_resumed_trial_that_waits_again_is_not_resumed_twice():
    s = make_pause_scheduler(3)
    for tid in ("a", "b", "c"):
        s.add_member(tid, 8)
        s.report(tid, 8, C_TOK * 0.1 * BUDGET_TOKENS, 0.1 * BUDGET_TOKENS, 3.0)
    assert s.report("a", 8, C_TOK * 0.25 * BUDGET_TOKENS, 0.25 * BUDGET_TOKENS, 2.0) == "pause"
    assert s.report("b", 8, C_TOK * 0.25 * BUDGET_TOKENS, 0.25 * BUDGET_TOKENS, 2.1) == "pause"
    assert s.report("c", 8, C_TOK * 0.25 * BUDGET_TOKENS, 0.25 * BUDGET_TOKENS, 2.5) == "stop"
    assert s.to_resume == ["a", "b"]
    # "a" is resumed first and reaches rung 1 before "b": it waits again, and must not be resumed again
    assert s.report("a", 8, C_TOK * 0.5 * BUDGET_TOKENS, 0.5 * BUDGET_TOKENS, 1.8) == "pause"
    assert s.to_resume == ["b"] and s.waiting == {"a": 1}


@pytest.mark.parametrize("rule", ["loss_at_rung", "predicted_final"])
@pytest.mark.parametrize("seed", range(4))
def test_pause_a_driver_killed_at_any_report_resumes_to_the_same_decisions(seed, rule):
    """Kill the driver after every possible number of reports; the resumed scheduler rebuilds the rungs
    from the reports alone and the sweep ends exactly as without the kill: the same trials pruned at
    the same rungs, the same FLOPs trained (a waiting trial is held, not restarted past its rung)."""
    rng = random.Random(seed)
    trials = [
        (
            f"b{b}-t{i}",
            b,
            line(3.0 + 0.1 * i + 0.01 * b, 0.4 + 0.17 * ((i * 5 + b) % 6)),
            sorted(set(rng.choice([cadence(8), cadence(6), random_cadence(rng)]))),
        )
        for b in (4, 8)
        for i in range(4)
    ]
    rng.shuffle(trials)
    concurrency = rng.randint(1, 3)
    whole = PausedSweep(make_pause_scheduler(4, rule=rule), trials, concurrency)
    reference = whole.run()
    pruned_at = {t: a["pruned_rung"] for t, a in whole.pruned.items()}
    total = sum(len(fr) for *_, fr in trials)
    if rule == "loss_at_rung":  # (predicted_final skips a rung whose fit points precede a trial's first report)
        assert sorted(reference.values()).count(1.0) == 2 and len(pruned_at) == 6  # one survivor per batch size
    assert pruned_at
    for kill_after in range(1, total):
        first = PausedSweep(make_pause_scheduler(4, rule=rule), trials, concurrency)
        first.run(max_reports=kill_after)
        second = first.resume(make_pause_scheduler(4, rule=rule))
        assert second.run() == reference, f"killed after {kill_after} reports"
        assert {t: a["pruned_rung"] for t, a in second.pruned.items()} == pruned_at, (
            f"killed after {kill_after} reports"
        )


def test_pause_resume_holds_the_waiting_trials_and_resumes_the_promoted_ones():
    """Hand-built: after the kill, rung 0 of batch size 8 is complete (decided again: c pruned, a and b
    promoted); a's last report is at the rung (held, to resume), b had been let go past it (restarts by
    itself); rung 0 of batch size 4 waits for its second trial (x held, waiting)."""
    s = make_pause_scheduler(3)

    def F(f):
        return (f * BUDGET_TOKENS, C_TOK * f * BUDGET_TOKENS)

    def obs(tid, b, fr, losses, **kw):
        s.observe(tid, b, [F(f)[0] for f in fr], [F(f)[1] for f in fr], losses, **kw)

    obs("a", 8, [0.125, 0.25], [3.0, 2.0])
    obs("b", 8, [0.125, 0.25, 0.375], [3.0, 2.1, 2.0])
    obs(
        "c",
        8,
        [0.125, 0.25],
        [3.0, 2.5],
        ended=True,
        pruning={"pruned": True, "pruned_rung": 0, "pruned_at_flops": F(0.25)[1], "rung_decisions": "r0:stop"},
    )
    obs("x", 4, [0.125, 0.25], [3.0, 2.2])
    obs("y", 4, [0.125], [3.1])
    obs("z", 4, [], [])
    s.restore_decisions()
    assert s.waiting == {"x": 0}
    assert s.to_resume == ["a"] and s.to_prune == ["c"]
    assert [(d.rung, d.stop) for d in s.decisions("a")] == [(0, False)] == [(d.rung, d.stop) for d in s.decisions("b")]
    assert [s.held(t) for t in "abcxyz"] == [True, False, True, True, False, False]
    assert s.pruned_while_paused["c"]["pruned_rung"] == 0
    # the restored trial x waits at rung 0 until y (restarted) reaches it and z ends before it; then the
    # rung is decided on x and y: y continues, x (held paused since the resume) is pruned
    assert s.report("y", 4, F(0.25)[1], F(0.25)[0], 2.1) == "pause"
    s.end("z")
    assert s.waiting == {} and s.to_resume == ["a", "y"] and s.to_prune == ["c", "x"]


def test_pause_on_trial_add_keeps_a_held_restored_trial_paused():
    """Tune's restore re-queues every unfinished trial as PENDING; the scheduler turns the ones it holds
    (waiting at a rung, to resume, to prune) into PAUSED before Tune files them, and leaves the others."""

    class T(SimpleNamespace):
        def set_status(self, status):
            self.status = status

    s = make_pause_scheduler(2)

    def F(f):
        return (f * BUDGET_TOKENS, C_TOK * f * BUDGET_TOKENS)

    s.observe("w", 8, [F(0.25)[0]], [F(0.25)[1]], [2.0])  # waits at rung 0 for its peer
    s.observe("r", 8, [F(0.125)[0]], [F(0.125)[1]], [2.5])  # mid-way to rung 0: restarts
    s.restore_decisions()
    tc = SimpleNamespace(search_alg=None)
    trials = {t: T(trial_id=t, config={"batch_size_sequences": 8}, status="PENDING") for t in ("w", "r", "new")}
    for t in trials.values():
        s.on_trial_add(tc, t)
    assert {t: x.status for t, x in trials.items()} == {"w": "PAUSED", "r": "PENDING", "new": "PENDING"}


def _rep(s, tid, f, loss, b=8):
    return s.report(tid, b, C_TOK * f * BUDGET_TOKENS, f * BUDGET_TOKENS, loss)


def _obs(s, tid, fr, losses, b=8, **kw):
    s.observe(tid, b, [f * BUDGET_TOKENS for f in fr], [C_TOK * f * BUDGET_TOKENS for f in fr], losses, **kw)


def test_pause_a_failed_trial_retried_after_a_resume_does_not_reopen_decided_rungs():
    """F failed before rung 0, which was then decided on A, B, C (A and B on, C pruned); A and B trained
    past it; the driver dies. On resume F is observed as ended (the rungs were decided without it),
    then reopened, since Tune retries errored trials: A and B are not held at rung 0 again, and F, on
    reaching the decided rung 0, is decided there on arrival (never un-promoting B)."""
    live = make_pause_scheduler(4)
    for t in "FABC":
        live.add_member(t, 8)
        _rep(live, t, 0.125, 3.0)
    live.end("F")  # Tune: on_trial_error
    assert [_rep(live, t, 0.25, v) for t, v in (("A", 2.0), ("B", 2.1), ("C", 2.5))] == ["pause", "pause", "stop"]
    s = make_pause_scheduler(4)
    _obs(s, "F", [0.125], [3.0], ended=True)  # the driver: FAILED is ended for the replay ...
    _obs(s, "A", [0.125, 0.25, 0.375], [3.0, 2.0, 1.9])
    _obs(s, "B", [0.125, 0.25, 0.375], [3.0, 2.1, 2.0])
    _obs(s, "C", [0.125, 0.25], [3.0, 2.5], ended=True, pruning=live.pruned_while_paused["C"])
    s.restore_decisions()
    s.reopen("F")  # ... then reopened
    assert not any(s.held(t) for t in "ABF") and s.held("C")
    assert [d.label() for d in s.decisions("B")] == [d.label() for d in live.decisions("B")]
    assert _rep(s, "F", 0.25, 1.8) == "continue"  # the best at rung 0: on, and B stays on
    assert [(d.rung, d.stop, d.peers) for d in s.decisions("F")] == [(0, False, 4)]
    assert [d.stop for d in s.decisions("B")] == [False]
    assert _rep(s, "F", 0.375, 1.7) == "continue"
    # rung 1 now waits for A, B and F (C was pruned): F, A, B reach it; the best of three goes on... two
    assert [_rep(s, t, 0.5, v) for t, v in (("F", 1.6), ("A", 1.7))] == ["pause", "pause"]
    assert _rep(s, "B", 0.5, 1.9) == "stop" and s.to_resume == ["F", "A"]


def test_pause_a_failed_trial_that_waited_at_a_rung_is_judged_there_when_retried():
    s = make_pause_scheduler(3)
    _obs(s, "F", [0.125, 0.25], [3.0, 2.6], ended=True)  # failed while waiting at rung 0
    _obs(s, "A", [0.125, 0.25], [3.0, 2.0])
    _obs(s, "B", [0.125], [3.0])
    s.restore_decisions()
    s.reopen("F")
    assert s.waiting == {"A": 0, "F": 0} and s.held("F")  # rung 0 undecided: F waits there, paused
    assert _rep(s, "B", 0.25, 2.1) == "continue"  # completes rung 0: A and B on, F pruned where it waits
    assert s.to_prune == ["F"] and s.to_resume == ["A"]


def test_pause_a_trial_that_ended_is_stopped_if_tune_restarts_it():
    s = make_pause_scheduler(2)
    _obs(s, "done", [0.5, 1.0], [2.0, 1.5], ended=True)
    s.restore_decisions()
    assert _rep(s, "done", 1.0, 1.5) == "stop"


@pytest.mark.parametrize("seed", range(8))
def test_pause_failures_and_a_driver_kill_never_hang_nor_train_past_an_undecided_rung(seed):
    """Random failures (a failed trial is retried after the resume, as Tune does), a kill at a random
    report: the sweep ends, every batch size keeps a trial that trains its whole budget, and every
    trial that was not pruned trained to the budget, and every pruned one to its rung's report."""
    rng = random.Random(100 + seed)
    trials = [
        (f"b{b}-t{i}", b, line(3.0 + 0.1 * rng.random(), 0.2 + rng.random()), cadence(rng.choice([6, 8])))
        for b in (4, 8)
        for i in range(4)
    ]
    first = PausedSweep(make_pause_scheduler(4), trials, rng.randint(1, 3))
    first.fail_at = {t: rng.randint(0, 5) for t, *_ in rng.sample(trials, 3)}
    first.run(max_reports=rng.randint(1, 40))
    second = first.resume(make_pause_scheduler(4))
    trained = second.run()
    assert set(trained) == {t for t, *_ in trials}
    for b in (4, 8):
        assert any(trained[t] == 1.0 for t, bb, *_ in trials if bb == b)
    for t, f in trained.items():
        if t in second.pruned:  # pruned where it waited: at the first report at or past its rung, not later
            rung = [0.25, 0.5][second.pruned[t]["pruned_rung"]]
            assert f == min(x for x in dict((u, fr) for u, _, _, fr in trials)[t] if x >= rung), (t, f)
        else:
            assert f == 1.0, (t, f)
