"""The answer in plain words (sweeps/analysis/summary.py): the headline sentence for every status, the status
texts, interval ends against the swept range, the definitions note; and the plan's knee label and one-line
summary (sweeps/analysis/plan.py, plan_files.py)."""

from __future__ import annotations

import ast
import copy
import json
from pathlib import Path

import numpy as np
import pytest

from sweeps.analysis import analyze_csv, analyze_trials
from sweeps.analysis.fit import STATUSES, analyze_points
from sweeps.analysis.summary import (
    STATUS_TEXT,
    SWEEP_STATUSES,
    definitions_text,
    describe_status,
    headline,
    interval_ends_text,
    swept_range,
)

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = Path(__file__).parent / "fixtures" / "wikitext_cbs.json"


def _fixture() -> dict:
    return json.loads(FIXTURE.read_text())


# ---- statuses -------------------------------------------------------------------------------------------


def _status_literals(path: Path) -> set[str]:
    """Every string given as ``status=...`` or compared as a status in ``path``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.keyword) and node.arg == "status" and isinstance(node.value, ast.Constant):
            out.add(node.value.value)
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "status" and isinstance(v, ast.Constant):
                    out.add(v.value)
    return {s for s in out if isinstance(s, str)}


def test_every_status_the_analysis_sets_has_words():
    assert set(STATUS_TEXT) == set(STATUSES) | set(SWEEP_STATUSES)
    set_in_code = (
        _status_literals(ROOT / "sweeps/analysis/fit.py")
        | _status_literals(ROOT / "sweeps/analysis/sweep.py")
        | _status_literals(ROOT / "sweeps/run/finish.py")
    )
    assert "no_completed_trials" in set_in_code and "analysis_failed" in set_in_code  # the scan sees them
    assert set_in_code <= set(STATUS_TEXT), set_in_code - set(STATUS_TEXT)
    assert describe_status("ok").startswith("the knee (b_crit) and its whole 95 % interval lie inside")
    assert "not one the analysis sets" in describe_status("bogus") and describe_status(None) == "no status recorded"


# ---- headline ---------------------------------------------------------------------------------------------


def test_headline_of_the_wikitext_sweep_says_where_how_wide_and_what_to_add():
    cbs = _fixture()  # edge: b_crit 11.06, interval [0.675, 70.3] over batch sizes 4..64 that reached 6.371
    text = headline(cbs)
    assert text == (
        "At target loss 6.371, the knee (b_crit) could lie anywhere from below 4 to above 64 sequences (its 95 % "
        "interval reaches past both ends of the fitted batch sizes (4-64 sequences, those that reached the target)), "
        "most likely near 11; this sweep cannot pin it closer "
        "than a factor of 16 (the interval's width within the fitted batch sizes; it is wider beyond); to narrow it, "
        "add batch sizes 2 and 1 (below 4) and raise budget_tokens so that batch size 128, swept but short "
        "of this target within its budget (in the fit only as a lower bound), reaches it."
    )
    assert swept_range(cbs) == (4.0, 64.0)  # the primary target's points, not per_batch's 128


def test_headline_of_each_status():
    t = _fixture()["targets"]
    assert headline(t[0]).startswith(
        "At target loss 6.656, the knee lies above the largest batch size that reached the target, 128 "
        "sequences (95 % interval from 35 up)"
    )
    assert headline(t[0]).endswith("to find the knee, add batch sizes 256 and 512.")
    assert (
        "lies above 9.6 sequences (95 % interval), possibly above the largest of the fitted batch sizes "
        "(4-128 sequences, those that reached the target), most likely "
        "near 44" in headline(t[1])
    )
    assert headline(t[1]).endswith("add batch sizes 256 and 512 (above 128).")
    below = analyze_points([4, 8, 16, 32], [100, 100, 100, 100.5], 8)
    assert below["status"] == "below_range"
    assert headline(below).startswith(
        "The knee lies below the smallest batch size that reached the target, 4 sequences"
    )
    assert headline(below).endswith("to find it, add batch sizes 2 and 1.")
    two = analyze_points([4, 8], [10, 6], 8)
    assert headline(two) == (
        "No knee can be identified: only 2 batch size(s) reached the target and the fit needs "
        "at least 3; run more batch sizes to the target (more trials, or a longer budget)."
    )
    for status, start in (
        ("no_completed_trials", "No trial completed"),
        ("no_targets", "No target loss could"),
        ("analysis_failed", "The analysis failed (boom)"),
    ):
        assert headline({"status": status, "message": "boom"}).startswith(start)


def test_headline_of_a_measured_knee_gives_the_20_percent_batch():
    B = np.array([4, 8, 16, 32, 64, 128, 256, 512], dtype=float)
    S = (100 + 2000 / B) * np.exp(np.random.default_rng(0).normal(0, 0.03, len(B)))
    fit = analyze_points(B, S, 16)
    assert fit["status"] == "ok" and fit["fitted_batch_sizes"] == list(B)
    lo, hi = fit["b_crit_ci"]
    assert headline(fit) == (
        f"The critical batch size b_crit lies between {lo:.0f} and {hi:.0f} sequences (95 % interval), most likely "
        f"near {fit['b_crit']:.0f}: batches up to about {0.2 * fit['b_crit']:.1f} sequences (0.2 b_crit) cost at most "
        f"20 % more compute than the least, and batches well above {fit['b_crit']:.0f} buy few steps for their compute."
    )


def test_headline_of_the_zhang_2024_points():
    # Zhang et al. 2024's published 1.2B steps: the knee sits next to the largest batch size (one above it)
    fit = analyze_csv(ROOT / "data" / "zhang2024" / "chinchilla_1.2B.csv", 256)
    assert fit["status"] == "edge"
    text = headline(fit)
    assert text.startswith(
        "The knee (b_crit) lies between 9,418 and 13,332 sequences (95 % interval), most likely "
        "near 11,131; it rests on fewer than 2 fitted batch sizes on its larger side"
    )
    assert text.endswith("to narrow it, add batch sizes 32,768 and 65,536 (above 16,384).")


def test_a_sweep_records_its_headline_and_fitted_batch_sizes():
    from sweeps.analysis import TrialRecord

    tokens = [256.0 * k for k in range(1, 41)]
    trials = []
    for b in (4, 8, 16, 32, 64):
        steps = 50 + 800 / b
        curve = [3.0 - 1.5 * min(1.0, t / (steps * b * 8)) for t in tokens]
        trials.append(
            TrialRecord(
                trial_id=f"t{b}",
                batch_size_sequences=b,
                seed=0,
                group_id=f"g{b}",
                status="COMPLETED",
                hyperparameters={"lr": 1e-3},
                tokens=tokens,
                val_loss=curve,
                flops=[t * 10 for t in tokens],
            )
        )
    cbs = analyze_trials(trials, context_length_tokens=8, reference_batch=8, targets=[2.0])
    assert cbs["headline"] == headline(cbs)
    assert cbs["fitted_batch_sizes"] == cbs["targets"][0]["fitted_batch_sizes"]
    none = analyze_trials([], context_length_tokens=8, reference_batch=8)
    assert none["headline"].startswith("No trial completed")


# ---- interval ends, definitions ----------------------------------------------------------------------------


def test_interval_ends_past_the_swept_range_are_bounds():
    assert interval_ends_text([0.675, 70.3], (4, 64)) == ("< 4", "> 64")
    assert interval_ends_text([9.6, None], (4, 128)) == ("9.6", "> 128")
    assert interval_ends_text([12.0, 40.0], (4, 128)) == ("12", "40")
    assert interval_ends_text([12.0, None], None) == ("12", "unbounded")
    assert interval_ends_text(None, (4, 8)) == ("-", "-")


def test_definitions_name_both_critical_batch_sizes_with_their_units():
    text = definitions_text(tokens_per_sequence=512, reference_batch=256)
    assert "Two definitions of the critical batch size" in text
    assert "b_crit: McCandlish et al. 2018 (arXiv 1812.06162, Eq. 2.12), B_crit = E_min / S_min" in text
    assert "in sequences; x 512 tokens per sequence for tokens (b_crit_tokens)" in text
    assert "cbs_20: Zhang et al. 2024 (arXiv 2410.21676)" in text and "B0 = 256 sequences by 20 %" in text
    assert "cbs_20 = 0.2 b_crit + 1.2 B0" in text
    assert "b_compute_overhead_20: 0.2 b_crit, in sequences: the largest batch whose compute" in text


# ---- the plan's knee and summary --------------------------------------------------------------------------


def test_a_knee_at_the_cap_with_time_still_falling_is_no_knee():
    from sweeps.analysis.plan import knee_devices, knee_label

    assert knee_label(knee_devices({1: 10.0, 2: 6.0, 4: 3.0})) == "no knee: time still falling at the cap (4 devices)"
    assert knee_label(knee_devices({1: 10.0, 2: 5.0, 4: 4.9})) == (
        "knee: 2 devices (time still falls up to the cap of 4 devices, by less than 5 %)"
    )
    assert knee_label(knee_devices({1: 10.0, 2: 8.0, 4: 5.0, 8: 5.1})) == (
        "knee: 4 devices (more buy less than 5 % of the time)"
    )
    assert knee_label(None) == "no knee: no device count fits the device-hours cap"


def test_plan_summary_is_one_line_naming_the_fastest_plan_and_the_knee():
    from sweeps.analysis.plan import ClusterSpec
    from sweeps.analysis.plan_files import load_plan_inputs, make_plan, plan_summary

    inputs = load_plan_inputs(FIXTURE, flops_per_token=1e12, params=1e6)
    capped = make_plan(inputs, ClusterSpec(devices=64, peak_flops_per_s=1e15, bandwidth_bytes_per_s=4.5e11))
    text = plan_summary(capped)
    assert "\n" not in text
    assert text.startswith("plan for target loss 6.371 on up to 64 devices: fastest B=64 sequences on 64 devices")
    assert text.endswith("no knee: time still falling at the cap (64 devices)")
    wide = make_plan(inputs, ClusterSpec(devices=4096, peak_flops_per_s=1e15, bandwidth_bytes_per_s=4.5e11))
    text = plan_summary(wide)
    assert "B far outside the swept range: an extrapolation of the fit" in text
    assert "; with B inside the swept range: B=64 sequences on 64 devices" in text
    assert text.endswith("knee: 128 devices (more buy less than 5 % of the time)")
    nothing = copy.deepcopy(wide)
    nothing["targets"] = []
    assert plan_summary(nothing).startswith("plan: no fitted target")


@pytest.mark.parametrize("name", ["85M", "1.2B"])
def test_the_zhang_csvs_keep_their_published_fit(name):
    # fitted_batch_sizes is new in the result; the numbers stay as data/zhang2024/SOURCES.md checks them
    fit = analyze_csv(ROOT / "data" / "zhang2024" / f"chinchilla_{name}.csv", 256)
    assert fit["fitted_batch_sizes"] == [2.0**k for k in range(6, 15)]
    assert fit["cbs_20"] == pytest.approx({"85M": 745.3201466381583, "1.2B": 2533.4108017868743}[name], rel=1e-6)


def test_the_note_beside_analyze_output_names_each_group(tmp_path):
    from sweeps.analysis.summary import analyze_note

    csv = tmp_path / "p.csv"
    rows = ["batch_size,steps_to_target,group"] + [
        f"{b},{100 + 2000 / b:.3f},{g}" for g in ("a", "b") for b in (4, 8, 16, 32, 64, 128, 256)
    ]
    csv.write_text("\n".join(rows) + "\n")
    grouped = analyze_csv(csv, 16)
    note = analyze_note(grouped).splitlines()
    assert note[0] == "a: " + headline(grouped["a"]) and note[1] == "b: " + headline(grouped["b"])
    assert note[3] == "Two definitions of the critical batch size, not comparable numbers:"
    assert "B0 = 16 sequences" in "\n".join(note)
    single = analyze_csv(ROOT / "data" / "zhang2024" / "chinchilla_85M.csv", 256)
    assert analyze_note(single).splitlines()[0] == headline(single)
    assert analyze_note({"kind": "comparison", "arms": []}) == ""


def test_the_run_summary_shows_the_interval_as_the_report_does(capsys, monkeypatch):
    """`critbatch run`'s last lines: the interval's ends as report.html shows them (an end past the fitted
    batch sizes as a bound), and the target loss to 4 significant digits, as the headline writes it; a
    newcomer read [1.5, 75.6] on stdout and [< 4, > 64] in the report as two answers."""
    from rich.console import Console

    from critbatch import main

    cbs = json.loads(FIXTURE.read_text())
    cbs.setdefault("b_crit_tokens", cbs["b_crit"] * 64)
    monkeypatch.setattr(main, "out", Console(soft_wrap=True, width=400))
    main._print_summary({"cbs": cbs, "output": "OUT"})
    text = capsys.readouterr().out
    assert (
        "95 % interval [< 4, > 64] (cbs.json: the raw ends), status edge, at target loss 6.371 (a global batch" in text
    )
    assert "[0.7" not in text and "70.3" not in text
