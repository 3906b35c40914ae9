"""`critbatch scale` on the two published steps-to-target tables of Zhang et al. 2024 (data/zhang2024: 85M at
1.7e9 tokens, 1.2B at 2.4e10, D = 20 N): an exponent with an interval from the two members' intervals, a
prediction with its interval, the published laws beside it, and bad input refused with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from critbatch.main import app

ROOT = Path(__file__).resolve().parents[2]
TABLES = [
    "--csv",
    str(ROOT / "data/zhang2024/chinchilla_85M.csv"),
    "--tokens",
    "1.7e9",
    "--n-params",
    "85e6",
    "--csv",
    str(ROOT / "data/zhang2024/chinchilla_1.2B.csv"),
    "--tokens",
    "2.4e10",
    "--n-params",
    "1.2e9",
    "--reference-batch",
    "256",
]


def _run(*args: str):
    return CliRunner().invoke(app, ["scale", *args])


def test_the_zhang_tables_give_an_exponent_with_an_interval_and_a_prediction(tmp_path):
    res = _run(
        *TABLES, "--predict-tokens", "2e12", "--tokens-per-sequence", "512", "--output", str(tmp_path / "s.json")
    )
    assert res.exit_code == 0, res.output
    got = json.loads((tmp_path / "s.json").read_text())
    assert got["gamma"] == pytest.approx(0.614, abs=0.001)
    assert got["gamma_ci"] == pytest.approx([0.529, 0.699], abs=0.001)
    # the 1.2B table's knee has fewer than two swept batch sizes above it (its own status: edge)
    assert got["status"] == "member_not_ok" and "chinchilla_1.2B.csv (edge)" in got["caveats"][0]
    assert "cannot tell data size from model size" in got["model_size"]
    pred = got["prediction"]
    assert pred["extrapolation_factor"] == pytest.approx(2e12 / 2.4e10)
    assert pred["interval"][0] < pred["b_crit"] < pred["interval"][1]
    assert {p["name"] for p in pred["published"]} >= {"Step Law b_opt", "Power Lines b_crit"}
    assert "extrapolated 83.3x beyond the largest budget swept" in got["answer"]


def test_zhang_et_als_own_quantity_grows_as_their_notebook_says():
    """The 20 % CBS (0.2 b_crit + 1.2 B0, the notebook's definition) of the same tables: the notebook's fit over
    five sizes gives about D^0.47; two of them here give an interval that holds it."""
    res = _run(*TABLES, "--quantity", "cbs_20")
    got = json.loads(res.stdout)
    assert got["gamma"] == pytest.approx(0.462, abs=0.001)
    assert got["gamma_ci"][0] < 0.47 < got["gamma_ci"][1]


@pytest.mark.parametrize(
    "args, says",
    [
        (["--csv", "a.csv"], "one --tokens per --csv"),
        (TABLES[:4], "--csv needs --reference-batch"),
        (TABLES[:6] + ["--reference-batch", "256"], "too_few_budgets"),
        ([], "give the study's members"),
        (TABLES + ["--quantity", "b_opt"], "--quantity must be one of"),
    ],
)
def test_bad_input_exits_2_naming_what_is_wrong(args, says):
    res = _run(*args)
    assert res.exit_code == 2 and says in res.output, res.output


def test_plan_takes_the_studys_prediction_and_its_interval(tmp_path):
    assert _run(*TABLES, "--predict-tokens", "2e12", "--output", str(tmp_path / "scale.json")).exit_code == 0
    plan = [
        "plan",
        str(tmp_path / "scale.json"),
        "--devices",
        "1024",
        "--peak-flops",
        "9.9e14",
        "--bandwidth",
        "5e10",
        "--output",
        str(tmp_path / "plan"),
    ]
    res = CliRunner().invoke(app, plan[:2] + plan[2:])
    assert res.exit_code == 2 and "--flops-per-token, --params, --tokens-per-sequence" in res.output
    res = CliRunner().invoke(
        app, plan + ["--flops-per-token", "7.2e9", "--params", "1.2e9", "--tokens-per-sequence", "2048"]
    )
    assert res.exit_code == 0, res.output
    got = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert [t["group"] for t in got["targets"]] == ["predicted", "interval low", "interval high"]
    b = {t["group"]: t for t in got["targets"]}
    # a larger b_crit lets more devices help: the upper end of the interval is never slower than the lower
    assert b["interval high"]["knee"]["time_to_target_s"] <= b["interval low"]["knee"]["time_to_target_s"]
    assert any("extrapolated 83.3x beyond the largest budget" in n for n in got["notes"])


STUDY2 = ROOT / "tests/fixtures/study2"


def test_the_main_jobs_study_gives_b_opt_per_budget_and_says_why_it_has_no_law(tmp_path):
    """The four members of the main job's study: at three budgets the lowest loss at D is at the smallest batch
    size swept (4), so only the 4x budget brackets B_opt, and there is no law of it to predict with."""
    cbs = [x for d in ("131072", "262144", "524288", "1048576") for x in ("--cbs", str(STUDY2 / f"tokens-{d}"))]
    res = _run(*cbs, "--predict-tokens", "1e9", "--output", str(tmp_path / "scale.json"))
    assert res.exit_code == 0, res.output
    got = json.loads((tmp_path / "scale.json").read_text())
    assert got["gamma"] == pytest.approx(0.901, abs=0.001)  # b_crit's law as before
    b_opt = got["b_opt"]
    assert [m["status"] for m in b_opt["members"]] == ["edge", "edge", "edge", "ok"]
    assert all(m["bound"]["side"] == "below" for m in b_opt["members"][:3])
    assert b_opt["members"][3]["batch_size_sequences"] == pytest.approx(10.7, abs=0.05)
    assert b_opt["members"][3]["batch_size_ci_sequences"] == pytest.approx([5.58, 14.42], abs=0.01)
    assert b_opt["status"] == "too_few_budgets" and b_opt["prediction"] is None and b_opt["gamma"] is None
    # trials stopped before D (at their targets, or pruned) have no loss at D: 45 of 105, counted per batch size
    assert b_opt["members"][0]["trials_by_batch_size"] == {"4": [2, 4], "8": [2, 5], "16": [2, 5]} | {
        "32": [3, 1],
        "64": [2, 0],
        "128": [4, 0],
    }
    assert any(c.startswith("45 of 105 trials: trials stopped before D") for c in b_opt["caveats"])
    assert "no B_opt law: 1 of 4 budgets bracket B_opt" in got["answer"]
    assert (tmp_path / "scale.png").stat().st_size > 0
    res = CliRunner().invoke(
        app,
        ["plan", str(tmp_path / "scale.json"), "--devices", "8", "--peak-flops", "1e14", "--bandwidth", "5e10"]
        + ["--flops-per-token", "1e6", "--params", "1.3e5", "--tokens-per-sequence", "64"]
        + ["--output", str(tmp_path / "plan")],
    )
    assert res.exit_code == 0, res.output
    assert "B_opt (not planned with): no B_opt law: 1 of 4 budgets bracket B_opt" in res.output


def test_plan_prints_the_predicted_b_opt_beside_b_crit(tmp_path):
    from tests.sweeps.scaling.test_b_opt import _synthetic_study

    measured = _synthetic_study(tmp_path / "members")
    cbs = [x for m, _ in measured for x in ("--cbs", m.label)]
    assert _run(*cbs, "--predict-tokens", "1e9", "--output", str(tmp_path / "scale.json")).exit_code == 0
    b_opt = json.loads((tmp_path / "scale.json").read_text())["b_opt"]
    res = CliRunner().invoke(
        app,
        ["plan", str(tmp_path / "scale.json"), "--devices", "8", "--peak-flops", "1e14", "--bandwidth", "5e10"]
        + ["--flops-per-token", "1e6", "--params", "1.3e5", "--tokens-per-sequence", "64"]
        + ["--output", str(tmp_path / "plan")],
    )
    assert res.exit_code == 0, res.output
    assert f"at 1e+09 tokens: ~{b_opt['prediction']['b_opt']:.3g} sequences" in res.output
    notes = json.loads((tmp_path / "plan" / "plan.json").read_text())["notes"]
    assert any(n.startswith("B_opt (the batch of lowest loss at the budget") for n in notes)


def _branch_output(folder: Path) -> Path:
    """A branch run's folder as ``critbatch branch`` leaves it on a sweep: ``cbs.json`` with its ``local_cbs``."""
    folder.mkdir()
    points = [(0, 8), (64_000, 16), (128_000, None), (256_000, 64)]
    local = [
        {"tokens_seen": t, "k_star": b and b / 8, "local_cbs_sequences": b, "losses": {"1": 2.5}} for t, b in points
    ]
    (folder / "cbs.json").write_text(json.dumps({"tokens_per_sequence": 64, "local_cbs": local}))
    return folder


def test_schedule_stays_under_a_branch_runs_local_cbs(tmp_path):
    branch = _branch_output(tmp_path / "branch")
    args = ["schedule", "--local-cbs", str(branch), "--total-tokens", "1e6", "--tokens-per-sequence", "64"]
    res = CliRunner().invoke(app, [*args, "--output", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    ramp = json.loads((tmp_path / "s" / "schedule.json").read_text())
    assert [s["batch_size_sequences"] for s in ramp["stages"]] == [8, 16, 32, 64]
    assert {s["bound"] for s in ramp["stages"]} == {"local_cbs"}
    assert "holds its last value" in res.output and "stages held by: 8 from 0 by local_cbs" in res.output
    olmo = json.loads((tmp_path / "s" / "olmo_core.json").read_text())
    assert olmo["batch_sizes"] == [8 * 64, 16 * 64, 32 * 64, 64 * 64]
    # with a study's law too: the lower of the two at every stage
    from sweeps.scaling import StudyMember, scale_result

    members = [
        StudyMember(d, 4 * (d / 2.6e5) ** 0.5, (3 * (d / 2.6e5) ** 0.5, 5 * (d / 2.6e5) ** 0.5))
        for d in (1.3e5, 2.6e5, 5.2e5)
    ]
    (tmp_path / "scale.json").write_text(json.dumps(scale_result(members)))
    res = CliRunner().invoke(app, [*args, "--output", str(tmp_path / "t"), str(tmp_path / "scale.json")])
    assert res.exit_code == 0, res.output
    both = json.loads((tmp_path / "t" / "schedule.json").read_text())
    assert both["bounds"] == ["law", "local_cbs"] and both["stages"][0]["bound"] == "law"
    assert both["stages"][0]["batch_size_sequences"] < ramp["stages"][0]["batch_size_sequences"]


@pytest.mark.parametrize(
    "args, says",
    [
        ([], "give a study's scale.json, --local-cbs BRANCH_OUTPUT, or both"),
        (["--local-cbs", "nowhere"], "no local_cbs in nowhere"),
    ],
)
def test_schedule_without_a_bound_exits_2(tmp_path, args, says):
    res = CliRunner().invoke(
        app,
        ["schedule", *args, "--total-tokens", "1e6", "--tokens-per-sequence", "64", "--output", str(tmp_path / "s")],
    )
    assert res.exit_code == 2 and says in res.output, res.output
    assert not (tmp_path / "s").exists()


STUDY2 = ROOT / "tests/fixtures/study2"


@pytest.mark.parametrize(
    "args, says",
    [
        # the same sweep twice, as a folder, its cbs.json or with a budget: one measurement, not two
        (["--cbs", str(STUDY2 / "tokens-131072"), "--cbs", str(STUDY2 / "tokens-131072")], "is given twice"),
        (["--cbs", f"{STUDY2}/tokens-131072/cbs.json", "--cbs", f"{STUDY2}/tokens-131072:262144"], "is given twice"),
        (TABLES[:4] + TABLES[:4] + ["--reference-batch", "256"], "is given twice"),
        (TABLES[:-1] + ["nan"], "--reference-batch must be positive and finite"),
        (TABLES[:5] + ["nan"] + TABLES[6:], "--n-params must be positive, finite"),
        (TABLES + ["--tokens-per-sequence", "inf"], "--tokens-per-sequence must be positive and finite"),
    ],
)
def test_repeated_members_and_non_finite_numbers_exit_2(args, says):
    res = _run(*args)
    assert res.exit_code == 2 and says in res.output, res.output


def test_two_members_at_one_budget_are_counted_as_one_budget():
    res = _run(*TABLES[:4], "--csv", TABLES[7], "--tokens", "1.7e9", "--reference-batch", "256")
    assert res.exit_code == 2 and "2 of 2 member(s) have one, at 1 distinct budget(s)" in res.output, res.output


def test_analyze_refuses_a_reference_batch_that_is_not_finite():
    res = CliRunner().invoke(app, ["analyze", "--csv", TABLES[1], "--reference-batch", "inf"])
    assert res.exit_code == 2 and "--reference-batch must be positive and finite" in res.output, res.output


@pytest.mark.parametrize(
    "prediction, says",
    [({"tokens": 1e9}, "extrapolation_factor, b_crit, interval"), ({"b_crit": None}, "needs b_crit as positive")],
)
def test_plan_refuses_a_prediction_it_cannot_read(tmp_path, prediction, says):
    res = _run(*TABLES, "--predict-tokens", "2e12", "--output", str(tmp_path / "scale.json"))
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "scale.json").read_text())
    data["prediction"] = prediction if "tokens" in prediction else {**data["prediction"], **prediction}
    (tmp_path / "scale.json").write_text(json.dumps(data))
    plan = ["plan", str(tmp_path / "scale.json"), "--flops-per-token", "5e8", "--params", "85e6"]
    res = CliRunner().invoke(
        app, [*plan, "--tokens-per-sequence", "512", "--devices", "8", "--peak-flops", "1e15", "--bandwidth", "5e10"]
    )
    assert res.exit_code == 2 and says in res.output, res.output


def _schedule(tmp_path: Path, *args: str):
    out = tmp_path / "s"
    res = CliRunner().invoke(app, ["schedule", *args, "--tokens-per-sequence", "64", "--output", str(out)])
    return res, out


def test_schedule_refuses_what_it_cannot_read_with_exit_2_and_writes_nothing(tmp_path):
    branch = _branch_output(tmp_path / "branch")
    scale = tmp_path / "scale.json"
    scale.write_text(json.dumps({"law": "b_crit(D) = b0 * (D / D0) ** gamma", "gamma": 0.5, "members": []}))
    local = tmp_path / "inf.json"
    local.write_text(
        json.dumps(
            {
                "local_cbs": [
                    {"tokens_seen": 0, "local_cbs_sequences": 8},
                    {"tokens_seen": 1e5, "local_cbs_sequences": float("inf")},
                ]
            }
        )
    )
    cases = [
        (["--local-cbs", str(branch), "--total-tokens", "inf"], "--total-tokens and --tokens-per-sequence must be"),
        (["--local-cbs", str(branch), "--total-tokens", "1e6", "--max-batch-sequences", "0"], "at least 1 sequence"),
        ([str(scale), "--total-tokens", "1e6"], "scale.json: b0 must be a finite number"),
        ([str(scale), "--local-cbs", str(branch), "--total-tokens", "1e6"], "scale.json: b0 must be a finite number"),
        (["--local-cbs", str(local), "--total-tokens", "1e6"], "sizes positive and finite"),
    ]
    for args, says in cases:
        res, out = _schedule(tmp_path, *args)
        assert res.exit_code == 2 and says in res.output, (args, res.output)
        assert not out.exists()
    (tmp_path / "s").write_text("a file")
    res, _ = _schedule(tmp_path, "--local-cbs", str(branch), "--total-tokens", "1e6")
    assert res.exit_code == 2 and "is a file: give a folder" in res.output, res.output
    assert (tmp_path / "s").read_text() == "a file"


def test_scale_refuses_an_output_that_is_a_folder(tmp_path):
    res = _run(*TABLES, "--output", str(tmp_path))
    assert res.exit_code == 2 and "is a folder: give the file to write scale.json to" in res.output, res.output
    assert list(tmp_path.iterdir()) == []


def test_plan_from_a_study_refuses_non_finite_model_options_and_an_output_that_is_a_file(tmp_path):
    res = _run(*TABLES, "--predict-tokens", "2e12", "--output", str(tmp_path / "scale.json"))
    assert res.exit_code == 0, res.output
    cluster = ["--devices", "8", "--peak-flops", "1e15", "--bandwidth", "5e10"]
    model = {"--flops-per-token": "5e8", "--params": "85e6", "--tokens-per-sequence": "512"}
    for option in model:
        args = [a for k, v in {**model, option: "nan"}.items() for a in (k, v)]
        res = CliRunner().invoke(app, ["plan", str(tmp_path / "scale.json"), *args, *cluster])
        assert res.exit_code == 2 and f"{option} must be a positive, finite number" in res.output, res.output
    (tmp_path / "out").write_text("a file")
    args = [a for k, v in model.items() for a in (k, v)]
    res = CliRunner().invoke(
        app, ["plan", str(tmp_path / "scale.json"), *args, *cluster, "--output", str(tmp_path / "out")]
    )
    assert res.exit_code == 2 and "is a file: give a folder" in res.output, res.output


def test_plan_from_a_prediction_inside_the_budgets_does_not_call_it_beyond_them(tmp_path):
    res = _run(*TABLES, "--predict-tokens", "1e10", "--output", str(tmp_path / "scale.json"))
    assert res.exit_code == 0, res.output
    model = ["--flops-per-token", "5e8", "--params", "85e6", "--tokens-per-sequence", "512"]
    cluster = ["--devices", "8", "--peak-flops", "1e15", "--bandwidth", "5e10"]
    res = CliRunner().invoke(app, ["plan", str(tmp_path / "scale.json"), *model, *cluster, "--json"])
    assert res.exit_code == 0, res.output
    notes = json.loads(res.stdout)["notes"]
    assert any("at 0.417x the largest budget the study swept" in n for n in notes), notes
    assert not any("beyond the largest budget" in n for n in notes)


def test_schedule_warns_when_the_local_cbs_was_measured_at_another_sequence_length(tmp_path):
    branch = _branch_output(tmp_path / "branch")  # measured in sequences of 64 tokens
    args = ["schedule", "--local-cbs", str(branch), "--total-tokens", "1e6", "--output"]
    res = CliRunner().invoke(app, [*args, str(tmp_path / "a"), "--tokens-per-sequence", "512"])
    assert res.exit_code == 0, res.output
    says = "measured in sequences of 64 tokens and is read here as sequences of 512"
    assert says in res.output and "8x the tokens" in res.output, res.output
    assert any(says in w for w in json.loads((tmp_path / "a" / "schedule.json").read_text())["warnings"])
    res = CliRunner().invoke(app, [*args, str(tmp_path / "b"), "--tokens-per-sequence", "64"])
    assert res.exit_code == 0 and "measured in sequences of" not in res.output, res.output


def test_schedule_takes_a_studys_folder_as_plan_does(tmp_path):
    res = _run(*TABLES, "--output", str(tmp_path / "study" / "scale.json"))
    assert res.exit_code == 0, res.output
    args = ["schedule", "--total-tokens", "1e11", "--tokens-per-sequence", "512", "--output"]
    by_file = CliRunner().invoke(app, [*args, str(tmp_path / "a"), str(tmp_path / "study" / "scale.json")])
    by_folder = CliRunner().invoke(app, [*args, str(tmp_path / "b"), str(tmp_path / "study")])
    assert by_file.exit_code == 0 and by_folder.exit_code == 0, by_folder.output
    assert (tmp_path / "a" / "schedule.json").read_text() == (tmp_path / "b" / "schedule.json").read_text()
