"""What `critbatch run` prints after a sweep: one number named for sizing, the others explained beside it."""

from __future__ import annotations

from critbatch import main
from critbatch.common import out
from sweeps.spec.result import CbsResult

CBS = {
    "target_loss": 2.4,
    "b_crit": 12.37,
    "b_crit_tokens": 791.7,
    "b_crit_ci": [9.27, 16.29],
    "status": "ok",
    "b_compute_overhead_20": 2.47,
    "b_compute_overhead_20_ci": [1.85, 3.26],
    "cbs_20": 21.67,
    "cbs_20_ci": [21.05, 22.46],
    "reference_batch": 16,
    "headline": "The answer in one sentence.",
    "caveats": ["One training seed: run a second seed."],
}


def test_the_summary_names_b_crit_for_sizing_and_explains_the_other_two(capsys):
    with out.capture() as cap:
        main._print_summary({"cbs": CBS})
    lines = cap.get().splitlines()
    sizing = next(ln for ln in lines if ln.startswith("size data parallelism with:"))
    assert "b_crit = 12.4 sequences" in sizing and "[9.3, 16]" in sizing and "2x the fewest steps" in sizing
    beside = next(ln for ln in lines if ln.startswith("beside it:"))
    assert "0.2 b_crit = 2.5 sequences [1.9, 3.3]" in beside
    assert "21.7 sequences [21.1, 22.5]" in beside and "narrower by the constant" in beside
    assert "not covered: One training seed" in cap.get()
    assert "CBS" not in sizing


def test_without_the_other_numbers_nothing_is_printed_beside():
    assert main._beside_b_crit(CbsResult(b_crit=10.0)) == ""


def test_a_comparison_prints_its_message_and_files_only():
    """A comparison's ``cbs`` has a target loss but no b_crit of its own: its arms' reports carry the numbers."""
    comparison = {"kind": "comparison", "reference_arm": "a", "targets": [2.4], "target_loss": 2.4, "arms": []}
    with out.capture() as cap:
        main._print_summary({"cbs": comparison, "message": "b: b_crit 12 vs a 11", "output": "/o"})
    assert cap.get().splitlines() == ["b: b_crit 12 vs a 11", "wrote /o/cbs.json and /o/report.html"]
