"""``critbatch plan``: the cost model against hand-computed cases, and the command on a copied cbs.json.

The cluster of the hand-computed cases: peak 1e6 FLOP/s per device, MFU 0.5 (5e5 FLOP/s delivered),
bandwidth 1e9 bytes/s, latency 1e-5 s; the model: 600 FLOPs per token, 10 tokens per sequence, a
1e6-byte gradient; the fit: S_min = 100, E_min = 1600 (b_crit 16).
"""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from critbatch.main import app
from sweeps.analysis.fit import analyze_points
from sweeps.analysis.plan import (
    ClusterSpec,
    default_batch_grid,
    device_grid,
    extrapolation,
    knee_devices,
    plan_rows,
    plan_target,
    ring_allreduce_s,
    steps_to_target,
)
from sweeps.analysis.plan_files import load_plan_inputs, make_plan, spec_sync_every_steps
from sweeps.analysis.report import _plan_section
from sweeps.spec.result import TargetFit

FIXTURE = Path(__file__).parent / "fixtures" / "wikitext_cbs.json"
FIT = TargetFit(s_min=100.0, e_min=1600.0, target_loss=3.0, status="ok", b_crit=16.0)
MODEL = dict(tokens_per_sequence=10.0, flops_per_token=600.0, gradient_bytes=1e6)


def cluster(**kw) -> ClusterSpec:
    return ClusterSpec(
        **{"devices": 4, "peak_flops_per_s": 1e6, "mfu": 0.5, "bandwidth_bytes_per_s": 1e9, "latency_s": 1e-5, **kw}
    )


def rows_by(rows):
    return {(r["batch_size_sequences"], r["devices"]): r for r in rows}


def test_steps_to_target_is_the_hyperbola():
    assert steps_to_target(8, 100.0, 1600.0) == pytest.approx(300.0)  # 100 + 1600/8
    assert steps_to_target(16, 100.0, 1600.0) == pytest.approx(200.0)  # = 2 S_min at B = b_crit
    assert steps_to_target(64, 100.0, 1600.0) == pytest.approx(125.0)  # = 1.25 S_min at 4 b_crit


def test_ring_allreduce_by_hand():
    assert ring_allreduce_s(1, 1e6, 1e9, 1e-5) == 0.0
    # N=2: 2*1/2 * 1e6/1e9 + 2*1*1e-5 = 1e-3 + 2e-5
    assert ring_allreduce_s(2, 1e6, 1e9, 1e-5) == pytest.approx(1.02e-3)
    # N=4: 2*3/4 * 1e6/1e9 + 2*3*1e-5 = 1.5e-3 + 6e-5
    assert ring_allreduce_s(4, 1e6, 1e9, 1e-5) == pytest.approx(1.56e-3)
    with pytest.raises(ValueError):
        ring_allreduce_s(0, 1e6, 1e9, 1e-5)


def test_rows_by_hand():
    r = rows_by(plan_rows(s_min=100.0, e_min=1600.0, cluster=cluster(), batch_sizes_sequences=[8], **MODEL))
    assert sorted(r) == [(8, 1), (8, 2), (8, 4)]
    # N=1: compute 600 * 8 * 10 / (1 * 1e6 * 0.5) = 0.096 s, no communication; S(8) = 300 steps
    one = r[(8, 1)]
    assert one["compute_s_per_step"] == pytest.approx(0.096)
    assert one["allreduce_s"] == 0.0 and one["comm_s_per_step"] == 0.0
    assert one["time_to_target_s"] == pytest.approx(300 * 0.096)  # 28.8 s
    assert one["device_hours"] == pytest.approx(28.8 / 3600)
    # N=4: compute 0.096/4 = 0.024 s + ring 1.56e-3 s = 0.02556 s a step; 300 steps = 7.668 s; 4 devices
    four = r[(8, 4)]
    assert four["compute_s_per_step"] == pytest.approx(0.024)
    assert four["step_s"] == pytest.approx(0.02556)
    assert four["time_to_target_s"] == pytest.approx(7.668)
    assert four["device_hours"] == pytest.approx(4 * 7.668 / 3600)
    assert four["sequences_per_device"] == 2.0 and four["grad_accum_steps"] == 1
    assert four["comm_fraction"] == pytest.approx(1.56e-3 / 0.02556)


def test_local_sgd_divides_the_allreduce_and_overlap_takes_the_max():
    h4 = rows_by(
        plan_rows(s_min=100.0, e_min=1600.0, cluster=cluster(), batch_sizes_sequences=[8], sync_every_steps=4, **MODEL)
    )[(8, 4)]
    assert h4["comm_s_per_step"] == pytest.approx(1.56e-3 / 4)  # one all-reduce per 4 steps
    assert h4["step_s"] == pytest.approx(0.024 + 3.9e-4)
    ov = rows_by(
        plan_rows(s_min=100.0, e_min=1600.0, cluster=cluster(overlap=True), batch_sizes_sequences=[8], **MODEL)
    )[(8, 4)]
    assert ov["step_s"] == pytest.approx(0.024)  # max(0.024, 0.00156)
    with pytest.raises(ValueError):
        plan_rows(s_min=100.0, e_min=1600.0, cluster=cluster(), batch_sizes_sequences=[8], sync_every_steps=0, **MODEL)


def test_devices_never_exceed_the_batch_and_micro_batch_sets_accumulation():
    r = rows_by(
        plan_rows(
            s_min=100.0,
            e_min=1600.0,
            cluster=cluster(micro_batch_size_sequences_max=1),
            batch_sizes_sequences=[2, 8],
            **MODEL,
        )
    )
    assert sorted(r) == [(2, 1), (2, 2), (8, 1), (8, 2), (8, 4)]  # N <= B
    assert r[(8, 2)]["grad_accum_steps"] == 4  # 8/2 = 4 sequences, 1 at a time
    # MFU is constant in the per-device batch, so accumulation does not change the time
    assert r[(8, 2)]["compute_s_per_step"] == pytest.approx(0.048)


def test_knee_is_the_fewest_devices_within_5_percent():
    k = knee_devices({1: 10.0, 2: 5.2, 4: 5.0, 8: 5.1})
    # min 5.0; 5 % over is 5.25; the fewest devices at or under 5.25 is 2
    assert k["devices"] == 2 and k["devices_at_min"] == 4 and k["min_time_to_target_s"] == 5.0
    assert k["still_falling"] is False
    assert knee_devices({1: 10.0, 2: 5.0}, threshold=0.0)["devices"] == 2
    assert knee_devices({1: 10.0, 2: 6.0, 4: 5.9})["still_falling"] is True
    assert knee_devices({}) is None


def test_the_cap_moves_the_best_plan():
    # device-hours at B=8: N=1 28.8 s x 1 = 0.008000; N=2 300 x (0.048 + 1.02e-3) = 14.706 s x 2 = 0.008170;
    # N=4 7.668 s x 4 = 0.008520. Without a cap N=4 is fastest; a 0.0083 cap leaves N=2.
    free = plan_target(FIT, cluster=cluster(), batch_sizes_sequences=[8], **MODEL)
    assert free["best"]["devices"] == 4 and free["best"]["time_to_target_s"] == pytest.approx(7.668)
    capped = plan_target(FIT, cluster=cluster(device_hours_cap=0.0083), batch_sizes_sequences=[8], **MODEL)
    assert capped["best"]["devices"] == 2
    assert capped["best"]["time_to_target_s"] == pytest.approx(300 * (0.048 + 1.02e-3))
    assert [r["within_cap"] for r in capped["rows"]] == [True, True, False]
    none = plan_target(FIT, cluster=cluster(device_hours_cap=1e-4), batch_sizes_sequences=[8], **MODEL)
    assert none["best"] is None and none["knee"] is None
    # the knee over devices at B=8: times 28.8, 14.706, 7.668 -> min 7.668 at N=4, nothing within 5 % below
    assert free["knee"]["devices"] == 4 and free["knee_by_batch"]["8"]["devices"] == 4


def test_communication_bound_knee():
    # a 1e8-byte gradient: ring at N=2 = 0.1 + 2e-5 s, at N=4 = 0.15 + 6e-5 s; compute at B=8 0.048, 0.024 s.
    # time: N=1 300*0.096 = 28.8; N=2 300*0.14802 = 44.4; N=4 300*0.17406 = 52.2 -> 1 device is fastest.
    t = plan_target(
        FIT,
        cluster=cluster(),
        batch_sizes_sequences=[8],
        tokens_per_sequence=10.0,
        flops_per_token=600.0,
        gradient_bytes=1e8,
    )
    assert t["knee"]["devices"] == 1 and t["best"]["devices"] == 1
    assert rows_by(t["rows"])[(8, 2)]["time_to_target_s"] == pytest.approx(300 * (0.048 + 0.10002))


def test_grids_and_extrapolation_flags():
    assert device_grid(4) == [1, 2, 4] and device_grid(6) == [1, 2, 4, 6]
    # swept 4..64: from 4 to 8 x 64 = 512 (above 64 devices and 4 b_crit = 44)
    assert default_batch_grid((4.0, 64.0), 64, 11.0) == [4, 8, 16, 32, 64, 128, 256, 512]
    assert default_batch_grid((5.0, 64.0), 1024, None)[0] == 4 and default_batch_grid((5.0, 64.0), 1024)[-1] == 1024
    assert [extrapolation(b, (4.0, 64.0)) for b in (1, 2, 4, 64, 128, 256)] == [
        "far",
        "near",
        "inside",
        "inside",
        "near",
        "far",
    ]
    assert extrapolation(8, None) is None


def test_cluster_spec_refuses_unknown_and_bad_fields():
    with pytest.raises(ValueError, match="bandwidth_gbps"):
        ClusterSpec(devices=4, peak_flops_per_s=1e15, bandwidth_bytes_per_s=1e9, bandwidth_gbps=400)
    with pytest.raises(ValueError, match="mfu"):
        ClusterSpec(devices=4, peak_flops_per_s=1e15, bandwidth_bytes_per_s=1e9, mfu=1.5)


def test_inputs_from_a_cbs_json_and_its_spec(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    shutil.copy(FIXTURE, sweep / "cbs.json")
    (sweep / "spec.yaml").write_text("resources:\n  sync:\n    every_steps: 8\n", encoding="utf-8")
    inp = load_plan_inputs(sweep)
    assert inp["tokens_per_sequence"] == 64.0 and inp["flops_per_token"] == 1437696.0
    assert inp["n_params"] == pytest.approx(1437696.0 / 6) and "flops_per_token / 6" in inp["n_params_source"]
    assert inp["spec_sync_every_steps"] == 8 and inp["out_dir"] == sweep
    assert [f["swept"] for f in inp["fits"]] == [(4.0, 128.0), (4.0, 128.0), (4.0, 64.0), (4.0, 64.0)]
    plan = make_plan(inp, cluster(devices=8))
    assert plan["inputs"]["sync_every_steps"] == 8
    assert plan["inputs"]["sync_every_steps_source"] == "spec resources.sync.every_steps"
    assert any("replica count" in n and "does not model" in n for n in plan["notes"])
    assert [t["headline"] for t in plan["targets"]] == [False, False, False, True]  # cbs.json's target_loss
    assert plan["targets"][0]["status"] == "above_range" and plan["targets"][0]["b_crit"] is None
    (sweep / "spec.yaml").write_text("resources:\n  sync:\n    every_steps: many\n", encoding="utf-8")
    assert spec_sync_every_steps(sweep / "spec.yaml") is None
    assert spec_sync_every_steps(tmp_path / "absent.yaml") is None
    plan = make_plan(load_plan_inputs(sweep, params=1000.0), cluster(), sync_every_steps=4)
    assert plan["inputs"]["gradient_bytes"] == 4000.0 and plan["inputs"]["sync_every_steps"] == 4
    assert any("fully synchronous sweep" in n for n in plan["notes"])


def test_a_target_without_fit_is_skipped(tmp_path):
    data = json.loads(FIXTURE.read_text())
    data["targets"][0].update(s_min=None, e_min=None, status="no_knee")
    (tmp_path / "cbs.json").write_text(json.dumps(data))
    plan = make_plan(load_plan_inputs(tmp_path / "cbs.json"), cluster())
    assert len(plan["targets"]) == 3 and plan["skipped"][0]["status"] == "no_knee"


def _cli(args):
    return CliRunner().invoke(app, ["plan", *args])


H100 = ["--devices", "16", "--peak-flops", "989e12", "--mfu", "0.4", "--bandwidth", "50e9", "--latency", "5e-6"]


def test_cli_on_a_sweep_folder_writes_plan_json_and_plot(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    shutil.copy(FIXTURE, sweep / "cbs.json")
    quiet = _cli([str(sweep), *H100])
    assert quiet.exit_code == 0 and quiet.stdout == "", quiet.output  # written to plan.json: no JSON unless asked
    assert "wrote" in quiet.stderr and quiet.stderr.strip().splitlines()[-1].startswith("plan for target loss")
    res = _cli([str(sweep), *H100, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["cluster"]["devices"] == 16 and len(out["targets"]) == 4
    on_disk = json.loads((sweep / "plan.json").read_text())
    assert on_disk["targets"][3]["knee"] == out["targets"][3]["knee"]
    png = sweep / "plots" / "plan.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    section = _plan_section(sweep)
    assert "Cluster plan" in section and "data:image/png;base64," in section
    assert _plan_section(tmp_path) == ""  # no plan.json: the report is as before


def test_cli_cluster_yaml_and_analyze_csv_result(tmp_path):
    res = analyze_points([64, 128, 256, 512, 1024], [46000, 23000, 13282, 7000, 3840], 256.0)
    (tmp_path / "fit.json").write_text(json.dumps(res))
    (tmp_path / "cluster.yaml").write_text("devices: 8\npeak_flops_per_s: 989.0e12\nbandwidth_bytes_per_s: 5.0e10\n")
    args = [
        str(tmp_path / "fit.json"),
        "--cluster",
        str(tmp_path / "cluster.yaml"),
        "--flops-per-token",
        "5.1e8",
        "--params",
        "8.5e7",
        "--tokens-per-sequence",
        "512",
        "--grad-bytes-per-param",
        "2",
        "--swept-range",
        "64,1024",
        "--output",
        str(tmp_path / "plan"),
        "--json",
    ]
    out = _cli(args)
    assert out.exit_code == 0, out.output
    plan = json.loads(out.stdout)
    assert plan["inputs"]["gradient_bytes"] == 1.7e8 and plan["cluster"]["mfu"] == 0.4
    assert plan["targets"][0]["rows"][0]["extrapolation"] == "inside"
    assert json.loads((tmp_path / "plan" / "plan.json").read_text()) == plan  # --output holds what was printed
    assert (tmp_path / "plan" / "plots" / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--flops-per-token", "5e8"], "--params, --tokens-per-sequence"),
        ([], "--flops-per-token, --params, --tokens-per-sequence"),
    ],
)
def test_cli_analyze_result_needs_the_model(tmp_path, extra, message):
    (tmp_path / "fit.json").write_text(
        json.dumps(analyze_points([64, 128, 256, 512], [46000, 23000, 13282, 7000], 256.0))
    )
    res = _cli([str(tmp_path / "fit.json"), *H100, *extra])
    assert res.exit_code == 2 and message in res.output


def test_cli_bad_input_exits_2(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    assert _cli([str(sweep), *H100]).exit_code == 2  # a folder without cbs.json
    shutil.copy(FIXTURE, sweep / "cbs.json")
    res = _cli([str(sweep), "--peak-flops", "1e15", "--bandwidth", "1e9"])  # no --devices
    assert res.exit_code == 2 and "devices" in res.output
    (tmp_path / "c.yaml").write_text("devices: 4\npeak_flops_per_s: 1e15\nbandwidth_bytes_per_s: 1e9\nnics: 2\n")
    res = _cli([str(sweep), "--cluster", str(tmp_path / "c.yaml")])
    assert res.exit_code == 2 and "nics" in res.output
    res = _cli([str(sweep), *H100, "--swept-range", "64"])
    assert res.exit_code == 2 and "--swept-range" in res.output
    (tmp_path / "junk.json").write_text("[1, 2]")
    assert _cli([str(tmp_path / "junk.json"), *H100]).exit_code == 2
    assert not (sweep / "plan.json").exists()


def test_cli_on_a_comparison_names_the_arm_folders_to_plan(tmp_path):
    comparison = tmp_path / "cmp"
    comparison.mkdir()
    (comparison / "cbs.json").write_text(
        json.dumps(
            {
                "kind": "comparison",
                "reference_arm": "ddp",
                "targets": [3.2, 3.0],
                "target_loss": 3.2,
                "arms": [{"name": "ddp"}, {"name": "diloco-m4-h16"}],
            }
        )
    )
    res = _cli([str(comparison), *H100])
    assert res.exit_code == 2, res.output
    assert "a comparison of arms ['ddp', 'diloco-m4-h16']" in res.output
    assert f"critbatch plan {comparison / 'arms' / 'ddp'}" in res.output.replace("\n", "")
    assert not (comparison / "plan.json").exists()


def test_cli_rewrites_the_report_with_the_plan_section(tmp_path):
    # a sweep folder as `critbatch run` leaves it (trimmed copies: cbs.json, one trial per batch size, spec.yaml)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    fixtures = Path(__file__).parent / "fixtures"
    shutil.copy(FIXTURE, sweep / "cbs.json")
    shutil.copy(fixtures / "wikitext_trials.json", sweep / "trials.json")
    shutil.copy(fixtures / "wikitext_spec.yaml", sweep / "spec.yaml")
    res = _cli([str(sweep), *H100])
    assert res.exit_code == 0, res.output
    page = (sweep / "report.html").read_text()
    assert "Cluster plan (critbatch plan)" in page and "critbatch report: wikitext-bpe" in page
    # the rest of the report, re-rendered (the fixtures hold no plots)
    assert (sweep / "plots" / "steps_to_target.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
