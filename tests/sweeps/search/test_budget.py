"""Sweep-wide FLOP budget: the trial plan (hand-computed) and the experiment stopper."""

from __future__ import annotations

import pytest

from sweeps.errors import InvalidInput
from sweeps.search.budget import SweepBudgetStopper, apply_plan, expected_trial_fraction, plan_trials
from sweeps.spec import PruningSpec, parse_spec

C_TOK = 1.0e5  # FLOPs per token (any value: the plan scales with it)


def spec_with(d: dict, *, sweep_flops=None, pruning=True, trials=4, seeds=(0,), mode="stop"):
    d = d | {
        "pruning": {"enabled": pruning, "mode": mode},
        "budget": {"sweep_flops": sweep_flops},
        "seeds": list(seeds),
    }
    d["search"] = d["search"] | {"trials_per_batch_size": trials}
    return parse_spec(d)


def test_expected_trial_fraction_hand_values():
    assert expected_trial_fraction(PruningSpec(enabled=False)) == 1.0
    # rungs 0.25, 0.5: all train to 0.25, half to 0.5, a quarter to 1
    assert expected_trial_fraction(PruningSpec(enabled=True)) == pytest.approx(0.25 + 0.25 / 2 + 0.5 / 4)
    # rungs 0.1, 0.3, 0.9 with r = 3
    got = expected_trial_fraction(PruningSpec(enabled=True, grace_fraction=0.1, reduction_factor=3))
    assert got == pytest.approx(0.1 + 0.2 / 3 + 0.6 / 9 + 0.1 / 27)


def test_no_budget_keeps_the_spec(tiny_spec_dict):
    spec = spec_with(tiny_spec_dict)
    plan = plan_trials(spec, C_TOK)
    assert (plan.trials_per_batch_size, plan.n_trials, plan.planned_flops, plan.reduced) == (4, 12, None, False)
    assert plan.trial_flops == C_TOK * 8192
    assert apply_plan(spec, plan) is spec


def test_plan_fits_the_budget_with_pruning(tiny_spec_dict):
    trial = C_TOK * 8192
    # 3 batch sizes x 1 seed; the first trial of each in full, then 0.5 of a trial each: 2 trials' worth
    # per batch size pays for 1 + 2 * 0.5 -> 3 trials per batch size
    spec = spec_with(tiny_spec_dict, sweep_flops=3 * trial * 2.0)
    plan = plan_trials(spec, C_TOK)
    assert (plan.trials_per_batch_size, plan.n_trials, plan.reduced) == (3, 9, True)
    assert plan.planned_flops == pytest.approx(3 * trial * 2.0)
    derived = apply_plan(spec, plan)
    assert derived.search.trials_per_batch_size == 3 and derived.n_trials == 9
    assert spec.search.trials_per_batch_size == 4  # the base spec is untouched
    assert derived.model_dump(exclude={"search"}) == spec.model_dump(exclude={"search"})


def test_paused_group_cost_hand_values():
    from sweeps.search.budget import paused_group_cost
    from sweeps.spec import PruningSpec

    p = PruningSpec(enabled=True, grace_fraction=0.25, reduction_factor=2.0)
    # rungs 0.25, 0.5: n trials to 0.25, ceil(n/2) on to 0.5, ceil(ceil(n/2)/2) to the budget
    assert [paused_group_cost(p, n) for n in (1, 2, 3, 4, 6)] == [1.0, 1.25, 1.75, 2.0, 3.25]
    assert paused_group_cost(PruningSpec(enabled=True, grace_fraction=0.25, reduction_factor=4.0), 4) == 1.75
    assert paused_group_cost(PruningSpec(enabled=False), 4) == 4.0


def test_plan_in_pause_mode_uses_the_exact_group_cost(tiny_spec_dict):
    trial = C_TOK * 8192
    spec = spec_with(tiny_spec_dict, sweep_flops=3 * trial * 1.8, mode="pause")  # 3 batch sizes, 1 seed
    plan = plan_trials(spec, C_TOK)
    assert (plan.trials_per_batch_size, plan.reduced) == (3, True)  # 3 trials cost 1.75, 4 cost 2.0
    assert plan.planned_flops == pytest.approx(3 * trial * 1.75)
    # two seeds: a batch size's rungs compare its trials of both seeds (one group of 2k trials)
    plan2 = plan_trials(spec_with(tiny_spec_dict, sweep_flops=3 * trial * 2.0, mode="pause", seeds=(0, 1)), C_TOK)
    assert (plan2.trials_per_batch_size, plan2.n_trials) == (2, 12)  # 4 trials of a batch size cost 2.0


def test_plan_without_pruning_counts_full_trials(tiny_spec_dict):
    trial = C_TOK * 8192
    spec = spec_with(tiny_spec_dict, sweep_flops=3 * trial * 2.5, pruning=False, seeds=(0,))
    assert plan_trials(spec, C_TOK).trials_per_batch_size == 2
    spec2 = spec_with(tiny_spec_dict, sweep_flops=2 * 3 * trial * 2.5, pruning=False, seeds=(0, 1))
    plan2 = plan_trials(spec2, C_TOK)
    assert (plan2.trials_per_batch_size, plan2.n_trials) == (2, 12)


def test_plan_never_exceeds_the_spec(tiny_spec_dict):
    spec = spec_with(tiny_spec_dict, sweep_flops=1e30)
    plan = plan_trials(spec, C_TOK)
    assert (plan.trials_per_batch_size, plan.reduced) == (4, False)


def test_budget_below_one_trial_per_batch_size_is_refused(tiny_spec_dict):
    trial = C_TOK * 8192
    spec = spec_with(tiny_spec_dict, sweep_flops=3 * trial * 0.99)
    with pytest.raises(InvalidInput, match="budget.sweep_flops"):
        plan_trials(spec, C_TOK)


def test_unknown_flops_per_token_plans_nothing(tiny_spec_dict):
    spec = spec_with(tiny_spec_dict, sweep_flops=1.0)
    plan = plan_trials(spec, None)
    assert (plan.trials_per_batch_size, plan.trial_flops, plan.sweep_flops) == (4, None, 1.0)


def test_stopper_sums_the_latest_flops_of_every_trial():
    s = SweepBudgetStopper(100.0, spent_flops=10.0)
    assert s("a", {"flops": 20.0}) is False
    assert s("a", {"flops": 40.0}) is False  # latest per trial, not a running sum of reports
    assert s("b", {"flops": 30.0}) is False
    assert s("b", {"val_loss": 1.0}) is False  # a result without flops changes nothing
    assert s.spent_flops == 80.0 and not s.stop_all()
    s("c", {"flops": 20.0})
    assert s.spent_flops == 100.0 and s.stop_all() and s.exhausted


def test_a_resumed_trial_s_reports_replace_its_past_flops_instead_of_adding_to_them():
    # resume: trial a had spent 40 and b 30; a restarts from its checkpoint and sends its reports again
    s = SweepBudgetStopper(200.0, spent_flops={"a": 40.0, "b": 30.0})
    assert s.spent_flops == 70.0
    s("a", {"flops": 20.0})
    s("a", {"flops": 40.0})
    assert s.spent_flops == 70.0  # counted once (it was 110 before the fix)
    s("a", {"flops": 60.0})
    assert s.spent_flops == 90.0 and not s.exhausted


def test_stopper_rejects_a_non_positive_budget():
    with pytest.raises(ValueError):
        SweepBudgetStopper(0.0)


# ---- through the CLI: plan, stop, analyse what finished --------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(240)  # ~3x idle: 76 s (4 trials, 2 at a time, on the suite's head); 110 s at load average ~10
def test_cli_sweep_plans_to_the_flop_budget_and_stops_cleanly(tmp_path, ray_head, mlflow_uri):
    """A budget the plan fits but the trials overrun: the budget stopper ends the sweep, which still
    analyses what completed and ends SUCCEEDED.

    The spec asks for 4 trials per batch size; mode "stop" plans each batch size's first trial in full
    and the others at the halving's expected 0.5 of a trial, so 1.6 trials' worth per batch size plans
    2 trials per batch size (1 + 0.5). With ``margin`` 1000 nats nothing is ever pruned, so the 4
    trials would train 4 full budgets: the stopper must fire at 3.2. Trials start in the searcher's
    order B4, B8, B4, B8, two at a time: the first two complete (2.0 < 3.2), and the budget runs out
    while the last two run (both batch sizes keep a completed trial)."""
    import json

    import yaml
    from mlflow.tracking import MlflowClient

    from sweeps.launch.workload import flops_accounting
    from tests.conftest import ROOT, TINY, run_cli, write_spec

    d = yaml.safe_load(TINY.read_text())
    d["name"] = "tiny-budget"
    # independent: the round-robin order of the docstring (transfer would run 8's trials before any of 4's)
    d["search"] |= {"batch_sizes_sequences": [4, 8], "trials_per_batch_size": 4, "strategy": "independent"}
    d["pruning"] = {"enabled": True, "mode": "stop", "margin": 1000.0}
    data = {"data": {"path": str(ROOT / "data" / "tinyshakespeare" / "input.txt")}}
    spec = parse_spec(d | data)
    c_tok = flops_accounting(spec)[0]
    trial = c_tok * spec.budget_tokens
    budget = 2 * 1.6 * trial
    d["budget"] = {"sweep_flops": budget}
    plan = plan_trials(parse_spec(d | data), c_tok)  # what the driver plans (hand value in the docstring)
    assert (plan.trials_per_batch_size, plan.n_trials) == (2, 4) and plan.planned_flops <= budget < 4 * trial
    path = write_spec(tmp_path, d)
    out, uri = tmp_path / "out", mlflow_uri
    r = run_cli(
        [
            "run",
            str(path),
            "--output",
            str(out),
            "--tracking-uri",
            uri,
            "--sweep-id",
            "budget-it",
            "--no-progress",
            "--address",
            ray_head.gcs_address,
        ],
        timeout_s=200,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    cbs = json.loads((out / "cbs.json").read_text())
    assert cbs["trials_planned"] == 4
    trials = json.loads((out / "trials.json").read_text())
    assert len(trials) == 4 and not any((t["pruning"] or {}).get("pruned") for t in trials)
    # the stopper fired: the trials running when the budget ran out were stopped, not finished
    assert cbs["trials"]["STOPPED"] >= 1 and any(t["status"] == "STOPPED" for t in trials)
    assert {t["batch_size_sequences"] for t in trials if t["status"] == "COMPLETED"} == {4, 8}
    spent = sum(t["flops"][-1] for t in trials if t["flops"])
    # the stopper acts on the report that crosses the budget: at most one milestone per running trial over it
    milestone = trial / spec.eval.milestones
    assert budget <= spent <= budget + spec.resources.max_concurrent_trials * milestone
    c = MlflowClient(uri)
    runs = c.search_runs([c.get_experiment_by_name("tiny-budget").experiment_id])
    parent = [x for x in runs if x.data.tags.get("critbatch.role") == "sweep"][0]
    assert parent.data.tags["critbatch.trials_planned"] == "4"
    assert parent.data.tags["critbatch.status"] == "SUCCEEDED" and parent.info.status == "FINISHED"
    assert f"the sweep's FLOP budget ({budget:.3g}) ran out" in parent.data.tags["critbatch.message"]
    stopped = [
        x
        for x in runs
        if x.data.tags.get("critbatch.role") == "trial" and x.data.tags.get("critbatch.status") == "STOPPED"
    ]
    assert len(stopped) == sum(1 for t in trials if t["status"] == "STOPPED")
