"""The study's orchestration: members at each budget, smallest first, each starting where the previous one found
the best learning rate at the base batch size; a stopped study continues where it stopped; a folder holding
another study is refused. The members are run by stand-ins that write what a finished sweep writes (the real
sweeps are the driver's, tested on their own): this checks the study's bookkeeping, not training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweeps.errors import InvalidInput
from sweeps.run.context import SweepResult
from sweeps.scaling.run import STUDY_TAG, member_spec, run_study
from sweeps.spec import load_spec

ROOT = Path(__file__).resolve().parents[3]
SPEC = ROOT / "sweeps/examples/shakespeare-char.yaml"


class Members:
    """Stand-ins for run_sweep / resume_sweep: each member 'finds' best LR = 2 x its start at the base batch."""

    def __init__(self, stop_at: int | None = None):
        self.started: list[tuple[int, float]] = []
        self.resumed: list[Path] = []
        self.stop_at = stop_at

    def _finish(self, folder: Path, spec_lr: float, b_crit: float) -> None:
        (folder / "sweep.json").write_text(json.dumps({"status": "SUCCEEDED"}))
        (folder / "cbs.json").write_text(
            json.dumps(
                {
                    "b_crit": b_crit,
                    "b_crit_ci": [b_crit / 1.5, b_crit * 1.5],
                    "status": "ok",
                    "target_loss": 2.4,
                    "tokens_per_sequence": 64.0,
                    "lr_per_batch": [{"batch_size_sequences": 16, "best_lr": 2 * spec_lr}],
                }
            )
        )
        (folder / "spec.yaml").write_text(f"search:\n  base_lr: {spec_lr}\n")

    def run(self, spec, folder: Path, **_):
        folder.mkdir(parents=True)
        self.started.append((spec.budget_tokens, spec.search.base_lr))
        if self.stop_at == spec.budget_tokens:
            (folder / "sweep.json").write_text(json.dumps({"status": "STOPPED"}))
            (folder / "spec.yaml").write_text(f"search:\n  base_lr: {spec.search.base_lr}\n")
            return SweepResult(
                ok=False, status="STOPPED", sweep_id="x", output=str(folder), cbs=None, message="", exit_code=130
            )
        self._finish(folder, spec.search.base_lr, 10 * (spec.budget_tokens / 262144) ** 0.5)
        return SweepResult(
            ok=True, status="SUCCEEDED", sweep_id="x", output=str(folder), cbs=None, message="", exit_code=None
        )

    def resume(self, folder: Path, **_):
        self.resumed.append(folder)
        lr = float((folder / "spec.yaml").read_text().split()[-1])
        self._finish(folder, lr, 10 * (int(folder.name.split("-")[1]) / 262144) ** 0.5)
        return SweepResult(
            ok=True, status="SUCCEEDED", sweep_id="x", output=str(folder), cbs=None, message="", exit_code=None
        )


def test_a_member_is_the_spec_at_its_budget_in_the_studys_experiment():
    spec = load_spec(SPEC)
    m = member_spec(spec, 524288, 0.005)
    assert (m.budget_tokens, m.search.base_lr, m.name) == (524288, 0.005, "shakespeare-char.D524288")
    assert m.experiment_name == spec.experiment_name and m.tracking.tags[STUDY_TAG] == spec.name


def test_each_member_starts_at_the_previous_best_lr_and_a_stopped_study_continues(tmp_path):
    spec = load_spec(SPEC)
    budgets = [131072, 262144, 524288]
    members = Members(stop_at=262144)
    study = run_study(spec, budgets, tmp_path / "s", run_member=members.run, resume_member=members.resume)
    assert study["status"] == "STOPPED" and study["exit_code"] == 130
    assert members.started == [(131072, 0.003), (262144, 0.006)]
    again = Members()
    study = run_study(spec, budgets, tmp_path / "s", run_member=again.run, resume_member=again.resume)
    assert study["status"] == "SUCCEEDED" and "exit_code" not in study
    assert again.resumed == [tmp_path / "s" / "members" / "tokens-262144"]
    assert again.started == [(524288, 0.012)]  # the resumed member found 2 x 0.006
    assert [m["start_lr"] for m in study["members"]] == [0.003, 0.006, 0.012]
    assert json.loads((tmp_path / "s" / "study.json").read_text()) == study


def test_a_folder_holding_another_study_or_anything_else_is_refused(tmp_path):
    spec = load_spec(SPEC)
    run_study(spec, [131072, 262144], tmp_path / "s", run_member=Members().run, resume_member=Members().resume)
    with pytest.raises(InvalidInput, match="another spec or other budgets"):
        run_study(spec, [131072, 524288], tmp_path / "s", run_member=Members().run)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("")
    with pytest.raises(InvalidInput, match="not empty and holds no study"):
        run_study(spec, [131072, 262144], tmp_path / "other", run_member=Members().run)
    with pytest.raises(InvalidInput, match="two or more distinct"):
        run_study(spec, [131072], tmp_path / "new", run_member=Members().run)
    assert not (tmp_path / "new").exists()
