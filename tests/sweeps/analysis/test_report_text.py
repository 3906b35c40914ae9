"""What report.html says (sweeps/analysis/report.py), read as text: the headline first, the status in words,
cbs.json's message, interval ends clipped to the swept range, a caption on every plot; and the b_crit plot's
bars clipped to the plotted range."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from sweeps.analysis.report import PLOT_CAPTIONS, _b_crit_by_target, write_report
from sweeps.analysis.summary import describe_status, headline
from sweeps.analysis.targets import TrialRecord
from sweeps.spec import load_spec
from sweeps.spec.result import CbsResult

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def report(tmp_path):
    """The wikitext sweep's report, rendered from the trimmed fixtures: ``(cbs, page text without images)``."""
    cbs = json.loads((FIXTURES / "wikitext_cbs.json").read_text())
    records = [TrialRecord.from_dict(r) for r in json.loads((FIXTURES / "wikitext_trials.json").read_text())]
    path = write_report(tmp_path, cbs, records, load_spec(FIXTURES / "wikitext_spec.yaml"))
    return cbs, re.sub(r"data:image/png;base64,[^\"]+", "IMG", path.read_text())


def _text(page: str) -> str:
    """The page's visible text, tags removed and entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def test_the_report_leads_with_the_headline_and_the_status_in_words(report):
    cbs, page = report
    body = page.split("</h1>", 1)[1]
    assert body.lstrip().startswith('<p class="headline"')
    first = _text(body.split("</p>", 1)[0]).strip()
    assert first == headline(cbs)
    text = _text(page)
    assert f"Status edge: {describe_status('edge')}." in text
    assert (
        "Analysis message: The 95 % interval reaches below the smallest and above the largest swept batch size" in text
    )


def test_interval_ends_past_the_swept_range_are_shown_as_bounds(report):
    cbs, page = report
    text = _text(page)
    # the headline target: raw [0.675, 70.3] over the batch sizes 4..64 that reached it
    assert "b_crit = 11.1 sequences (708 tokens), 95 % interval [< 4, > 64] sequences at target loss 6.371" in text
    assert "128 did not reach it within its budget and enter the fit only as censored points" in text
    assert "0.6751" not in text and "70.34" not in text  # the raw ends stay in cbs.json only
    rows = re.findall(r"<tr>(<td>.*?)</tr>", page.split("<h2>Per target loss</h2>", 1)[1].split("</table>", 1)[0])
    cells = [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", r)] for r in rows]
    assert [c[1:4] for c in cells] == [
        ["> 128", "35", "> 128"],
        ["44", "9.6", "> 128"],
        ["12.2", "< 4", "> 64"],
        ["11.06", "< 4", "> 64"],
    ]


def test_every_plot_has_a_caption_saying_how_to_read_it(report):
    _, page = report
    figures = re.findall(r'<img src="IMG" alt="(\w+)"><figcaption>(.*?)</figcaption>', page)
    assert {n for n, _ in figures} == {"loss_vs_flops", "steps_to_target", "tokens_to_target", "b_crit_by_target"}
    for name, caption in figures:
        assert html.unescape(caption).endswith(PLOT_CAPTIONS[name]), name
    assert (
        "Where the points fall with slope -1, doubling the batch halves the steps" in PLOT_CAPTIONS["steps_to_target"]
    )
    text = _text(page)
    assert "Two definitions of the critical batch size, not comparable numbers:" in text
    assert "b_compute_overhead_20: 0.2 b_crit, in sequences" in text


def test_the_b_crit_plot_clips_its_bars_to_the_swept_range():
    targets = CbsResult.model_validate_json((FIXTURES / "wikitext_cbs.json").read_text()).targets or []
    fig = _b_crit_by_target(targets)
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    assert lo == pytest.approx(4 / 1.5) and hi == pytest.approx(128 * 1.5)  # the swept sizes, not 0.675 or 412
    ends = [y for line in ax.get_lines() for y in line.get_ydata()]
    assert min(ends) >= 4 and max(ends) <= 128
    bars = [seg for coll in ax.collections for seg in coll.get_segments()]
    assert bars and all(4 <= y <= 128 for seg in bars for _, y in seg)
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_the_plan_section_says_still_falling_at_the_cap(tmp_path):
    from typer.testing import CliRunner

    from critbatch.main import app

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    for src, dst in (
        ("wikitext_cbs.json", "cbs.json"),
        ("wikitext_trials.json", "trials.json"),
        ("wikitext_spec.yaml", "spec.yaml"),
    ):
        shutil.copy(FIXTURES / src, sweep / dst)
    res = CliRunner().invoke(
        app,
        [
            "plan",
            str(sweep),
            "--devices",
            "64",
            "--peak-flops",
            "1e15",
            "--bandwidth",
            "4.5e11",
            "--flops-per-token",
            "1e12",
            "--params",
            "1e6",
        ],
    )
    assert res.exit_code == 0, res.output
    text = _text((sweep / "report.html").read_text())
    assert "No knee: time still falling at the cap (64 devices)" in text
    assert "Plan for target loss 6.371 on up to 64 devices: fastest B=64 sequences on 64 devices" in text
    assert "Knee: 64 devices" not in text


def test_the_loss_plot_places_each_trials_loss_at_the_tokens_it_reported_it_at():
    """The envelope matched trials by report index, so a loss was drawn at the tokens of another
    trial's report (two fine-tuning seeds of one batch size stop at different real tokens)."""
    from sweeps.analysis.report import _envelopes

    def rec(tid, tokens, losses):
        return TrialRecord(
            trial_id=tid,
            batch_size_sequences=8,
            seed=0,
            group_id=tid,
            status="COMPLETED",
            hyperparameters={},
            tokens=tokens,
            val_loss=losses,
            flops=[6.0 * t for t in tokens],
        )

    a, b = rec("a", [100.0, 200.0, 300.0], [3.0, 2.0, 1.0]), rec("b", [150.0, 250.0], [2.5, 1.5])
    tok, flops, loss = _envelopes([a, b])[8]
    assert tok.tolist() == [100.0, 150.0, 200.0, 250.0, 300.0]
    assert loss.tolist() == [3.0, 2.5, 2.0, 1.5, 1.0] and flops.tolist() == [600.0, 900.0, 1200.0, 1500.0, 1800.0]
    same = rec("c", [100.0, 200.0, 300.0], [2.9, 2.1, 0.9])  # the same tokens: the lower of the two at each
    assert _envelopes([a, same])[8][2].tolist() == [2.9, 2.0, 0.9]


def test_the_20_percent_batch_sizes_are_shown_with_their_intervals(tmp_path):
    # the fixture predates the intervals: add them as the analysis now writes them (cbs_20_interval)
    from sweeps.analysis import cbs_20_interval

    cbs = json.loads((FIXTURES / "wikitext_cbs.json").read_text())
    cbs["cbs_20_ci"], cbs["b_compute_overhead_20_ci"] = cbs_20_interval(cbs["b_crit_ci"], cbs["reference_batch"])
    cbs["b_compute_overhead_20"] = 0.2 * cbs["b_crit"]
    records = [TrialRecord.from_dict(r) for r in json.loads((FIXTURES / "wikitext_trials.json").read_text())]
    page = write_report(tmp_path, cbs, records, load_spec(FIXTURES / "wikitext_spec.yaml")).read_text()
    text = _text(re.sub(r"data:image/png;base64,[^\"]+", "IMG", page))
    # b_crit 11.06 [0.675, 70.34], B0 = 16: cbs_20 = 0.2 b + 19.2 -> 21.41 [19.34, 33.27]; 0.2 b -> 2.212 [0.135, 14.07]
    assert "21.41 [19.34, 33.27] sequences" in text
    assert (
        "2.212 [0.135, 14.07] sequences (below the smallest fitted batch size, 4: an extrapolation of the fit)" in text
    )
    # one number is named for sizing; the other two are explained as following from it
    assert "Size data parallelism with b_crit" in text
    assert "looks narrower only by its constant 1.2 B0" in text


def test_the_report_gives_the_measured_lr_exponent_and_each_batch_sizes_best_lr(tmp_path):
    cbs = json.loads((FIXTURES / "wikitext_cbs.json").read_text())
    b0 = cbs["per_batch"][0]["batch_size_sequences"]
    cbs |= {
        "lr_scaling_exponent_fit": 0.42,
        "lr_scaling_exponent_ci": [0.1, 0.74],
        "lr_scaling_rules_in_interval": ["sqrt"],
        "lr_scaling_exponent_by_chance": {"mean": 0.5, "sd": 0.2},
        "lr_per_batch": [
            {
                "batch_size_sequences": b0,
                "best_lr": 0.004,
                "method": "quadratic",
                "best_lr_bracket": [0.002, None],
                "n_trials_to_target": 3,
            }
        ],
    }
    records = [TrialRecord.from_dict(r) for r in json.loads((FIXTURES / "wikitext_trials.json").read_text())]
    page = write_report(tmp_path, cbs, records, load_spec(FIXTURES / "wikitext_spec.yaml")).read_text()
    text = _text(re.sub(r"data:image/png;base64,[^\"]+", "IMG", page))
    assert (
        "best LR ~ B^alpha with alpha = 0.42 [0.10, 0.74] (95 %); rules inside the interval: square root (0.5)." in text
    )
    assert "picked at random gives 0.5 ± 0.2" in text
    assert "0.004 (quadratic) [0.002, ?]" in text


def test_the_report_says_what_search_precision_did_and_names_open_lr_brackets(tmp_path):
    cbs = json.loads((FIXTURES / "wikitext_cbs.json").read_text())
    records = [TrialRecord.from_dict(r) for r in json.loads((FIXTURES / "wikitext_trials.json").read_text())]
    cbs["lr_brackets_open"] = [
        {"batch_size_sequences": 4, "side": "above", "fastest_lr": 0.01, "targets": [6.4]},
        {"batch_size_sequences": 64, "side": "below", "fastest_lr": 0.01, "targets": [6.4]},
    ]
    cbs["precision"] = {
        "b_crit_ratio_requested": 4.0,
        "max_trials": 24,
        "stopped_because": "max_trials",
        "waves": [
            {
                "trials": 12,
                "b_crit": 13.2,
                "b_crit_ci": [4.9, 33.4],
                "target_loss": 6.363,
                "added": [
                    {"batch_size_sequences": 16, "lr": 0.0085, "reason": "r"},
                    {"batch_size_sequences": 24, "lr": None, "reason": "r"},
                ],
            },
            {"trials": 15, "b_crit": 20.0, "b_crit_ci": [10.0, 40.0], "target_loss": 6.363, "added": []},
        ],
    }
    page = write_report(tmp_path, cbs, records, load_spec(FIXTURES / "wikitext_spec.yaml")).read_text()
    text = _text(re.sub(r"data:image/png;base64,[^\"]+", "IMG", page))
    assert "Open LR brackets: B=4 above its tried LRs, B=64 below its tried LRs" in text
    assert "asked for an interval within 4x, at most 24 trials; stopped because max_trials" in text
    assert "after 12 trials 13.2" in text and "added B=16 at LR 0.0085, B=24 (new)" in text


def test_the_targets_table_says_what_each_censored_point_needs_more_than_and_where_the_fit_disagrees():
    from sweeps.analysis.summary import censored_text

    t = {
        "excluded_batch_sizes": [128, 256, 512],
        "censored_points": [
            {"batch_size_sequences": 128, "steps_lower_bound": 32.0, "fit_steps": 45.2, "fit_consistent": True},
            {"batch_size_sequences": 256, "steps_lower_bound": 16.0, "fit_steps": 12.5, "fit_consistent": False},
            {"batch_size_sequences": 512, "steps_lower_bound": None, "fit_steps": None, "fit_consistent": None},
        ],
    }
    assert censored_text(t) == "128 (> 32 steps; fit 45.2), 256 (> 16 steps; fit 12.5, contradicts), 512 (diverged)"
    assert censored_text({"excluded_batch_sizes": [128]}) == "128"  # a cbs.json from before censored points


def test_the_budget_sentence_says_what_each_batch_size_trained_when_budgets_differ(tmp_path):
    """Token reallocation gave B = 4 32,768 tokens while the spec's budget is 196,608: the report once still
    said "(equal for every batch size)"."""
    from sweeps.analysis.summary import budget_text

    same = [{"batch_size_sequences": 8, "budget_tokens": 196608.0, "tokens_trained": 393216.0}]
    assert budget_text(196608, same) == "Budget 196,608 tokens per trial (equal for every batch size)"
    assert budget_text(196608, []) == "Budget 196,608 tokens per trial (equal for every batch size)"
    cbs = json.loads((FIXTURES / "wikitext_cbs.json").read_text())
    for p in cbs["per_batch"]:
        p["budget_tokens"], p["tokens_trained"] = 196608.0, 2 * 196608.0
    cbs["per_batch"][0].update(budget_tokens=32768.0, tokens_trained=65536.0)  # B = 4
    cbs["per_batch"][1].update(budget_tokens=393216.0, tokens_trained=589824.0)  # B = 8, one re-run at 2x
    records = [TrialRecord.from_dict(r) for r in json.loads((FIXTURES / "wikitext_trials.json").read_text())]
    page = write_report(tmp_path, cbs, records, load_spec(FIXTURES / "wikitext_spec.yaml")).read_text()
    text = _text(re.sub(r"data:image/png;base64,[^\"]+", "IMG", page))
    assert "equal for every batch size" not in text
    assert (
        "Budget 196,608 tokens per trial in the spec; the batch sizes' trials trained different amounts, at most "
        "per trial: B = 4: 32,768 tokens (65,536 in all); B = 8: 393,216 tokens (589,824 in all); "
        "B = 16: 196,608 tokens (393,216 in all)"
    ) in text


def test_the_wide_tables_scroll_inside_their_own_box(report):
    """The per-batch table (15 columns) overflowed a 1400-px page: it sits in a wrapper that scrolls sideways."""
    _, page = report
    css = re.search(r"div\.table-scroll\{([^}]*)\}", page)
    assert css and "overflow-x:auto" in css.group(1)
    per_batch = page.split("<h2>Per batch size</h2>", 1)[1]
    assert re.match(r'<p>[^<]*</p>\s*<div class="table-scroll"><table><tr><th>B \(seq\)</th>', per_batch)
    assert per_batch.split("</table>", 1)[1].startswith("</div>")


def test_the_local_cbs_plot_draws_each_branch_point_of_cbs_json():
    from sweeps.analysis.report import _local_cbs

    cbs = CbsResult.model_validate(
        {
            "local_cbs": [
                {"tokens_seen": 0, "k_star": 2, "local_cbs_sequences": 16},
                {"tokens_seen": 8192, "k_star": 4, "local_cbs_sequences": 32},
            ]
        }
    )
    fig = _local_cbs(cbs.local_cbs or [])
    assert fig is not None
    (line,) = fig.axes[0].lines
    assert np.asarray(line.get_xdata()).tolist() == [0, 8192] and np.asarray(line.get_ydata()).tolist() == [16, 32]
    assert _local_cbs([]) is None
