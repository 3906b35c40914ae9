"""Equal-compute pruning through real Ray Tune, Optuna RDB storage and MLflow (no mocks).

Two levels:

* ``test_tune_*``: the scheduler, its annotator, the ``BatchSizeSearcher`` (Optuna studies in SQLite),
  the MLflow callback and the budget stopper inside a real ``Tuner``, with a function trainable that
  reports synthetic loss curves (seconds, no Ray Train).
* ``test_cli_*``: a tiny pruned sweep through ``python -m sweeps.cli run`` (real training).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, TINY, run_cli, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # 8 real trials: minutes on 2 busy cores

CLI = [sys.executable, "-m", "sweeps.cli"]


# ---- Tune level: synthetic curves ----------------------------------------------------------------------

C_TOK = 1.0e6


def synthetic_trainable(config):
    """Reports 8 milestones of a loss curve whose level depends on the LR multiplier's distance from 1."""
    from ray import tune

    budget = config["_budget_tokens"]
    level = 2.0 + abs(math.log(config["lr_multiplier"]))
    for i in range(1, 9):
        f = i / 8
        loss = level + 0.5 * f ** -0.5
        done = i == 8
        tune.report({"tokens_seen": f * budget, "flops": C_TOK * f * budget, "val_loss": loss, "objective": loss,
                     "status": "completed" if done else "running", "done": done})


@pytest.fixture(scope="module")
def ray_local():
    import ray
    from ray import cloudpickle

    # the synthetic trainable lives in this test module, which Ray's workers cannot import by name
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def _tune_sweep(tmp, mode: str, study_prefix: str) -> dict:
    """A real Tuner over 2 batch sizes x 6 synthetic trials with the scheduler in ``mode``.

    Mode "stop" uses Tune's concurrency limiter; mode "pause" gives the searcher the scheduler's gate
    instead (the limiter would count paused trials as running)."""
    from ray import tune

    from sweeps.pruning.scheduler import EqualComputeScheduler
    from sweeps.search.searcher import BatchSizeSearcher
    from sweeps.spec import parse_spec
    from sweeps.tracking.writer import MlflowTrialCallback, Tracker

    d = yaml.safe_load(TINY.read_text())
    d["data"]["path"] = str(ROOT / "data" / "tinyshakespeare" / "input.txt")
    d["search"] |= {"batch_sizes_sequences": [4, 8], "trials_per_batch_size": 6, "lr_multiplier": [0.1, 10.0]}
    d["pruning"] = {"enabled": True, "mode": mode}
    d["resources"] = {"max_concurrent_trials": 2}
    spec = parse_spec(d)
    tracker = Tracker(MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}"), spec, study_prefix)
    tracker.start_parent()
    storage = f"sqlite:///{tmp / 'optuna.db'}"
    scheduler = EqualComputeScheduler.from_spec(spec)
    searcher = BatchSizeSearcher(spec, storage_url=storage, study_prefix=study_prefix)
    if mode == "pause":
        scheduler.state_path = str(tmp / "pruned_while_paused.json")
        searcher.scheduler = scheduler
    tuner = tune.Tuner(
        tune.with_resources(synthetic_trainable, {"cpu": 0.5}),
        param_space={"_budget_tokens": spec.budget_tokens},
        tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler, num_samples=spec.n_trials,
                                    max_concurrent_trials=2 if mode == "stop" else None),
        run_config=tune.RunConfig(name="tune", storage_path=str(tmp), verbose=0,
                                  callbacks=[scheduler.annotator(), MlflowTrialCallback(tracker, lambda cfg: {})]),
    )
    grid = tuner.fit()
    tracker.outbox.drain(timeout_s=30)
    return {"grid": grid, "tmp": tmp, "storage": storage, "tracker": tracker, "spec": spec, "scheduler": scheduler}


@pytest.fixture(scope="module")
def tune_sweep(ray_local, tmp_path_factory):
    return _tune_sweep(tmp_path_factory.mktemp("tune"), "stop", "tune-it")


def test_tune_pruned_trials_carry_the_decision_in_last_result_and_result_json(tune_sweep):
    results = list(tune_sweep["grid"])
    pruned = [r for r in results if r.metrics.get("pruned")]
    assert 1 <= len(pruned) < len(results)
    budget_flops = C_TOK * tune_sweep["spec"].budget_tokens
    for r in pruned:
        m = r.metrics
        assert m["pruned_at_flops"] in (0.25 * budget_flops, 0.5 * budget_flops)
        assert m["flops"] >= m["pruned_at_flops"] and m["flops"] < budget_flops
        assert "stop(" in m["rung_decisions"]
        with open(os.path.join(r.path, "result.json")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        assert rows[-1]["pruned"] is True and rows[-1]["pruned_at_flops"] == m["pruned_at_flops"]
    # every batch size keeps a trial that trained its whole budget
    full = {r.config["batch_size_sequences"] for r in results if not r.metrics.get("pruned") and r.metrics["flops"] == budget_flops}
    assert full == {4, 8}


def test_tune_pruned_trials_are_pruned_in_the_optuna_studies(tune_sweep):
    results = list(tune_sweep["grid"])
    for b in (4, 8):
        study = optuna.load_study(study_name=f"tune-it-B{b}", storage=tune_sweep["storage"])
        states = [t.state for t in study.get_trials(deepcopy=False)]
        n_pruned = sum(1 for r in results if r.config["batch_size_sequences"] == b and r.metrics.get("pruned"))
        assert states.count(optuna.trial.TrialState.PRUNED) == n_pruned
        assert states.count(optuna.trial.TrialState.COMPLETE) == 6 - n_pruned


def test_tune_pruned_trials_are_pruned_in_mlflow(tune_sweep):
    tracker = tune_sweep["tracker"]
    c = tracker.client
    children = c.search_runs([tracker.experiment_id], filter_string="tags.`critbatch.role` = 'trial'")
    by_trial = {r.data.tags["critbatch.trial_id"]: r for r in children}
    for r in tune_sweep["grid"]:
        run = by_trial[r.metrics["trial_id"]]
        assert run.data.tags["critbatch.status"] == ("PRUNED" if r.metrics.get("pruned") else "COMPLETED")


@pytest.fixture(scope="module")
def tune_sweep_pause(ray_local, tmp_path_factory):
    """Mode "pause" in a real Tuner: the scheduler gates the searcher, pauses and resumes real Tune trials."""
    return _tune_sweep(tmp_path_factory.mktemp("tune-pause"), "pause", "tune-pause")


def test_tune_pause_keeps_the_top_half_of_each_batch_size_at_each_rung(tune_sweep_pause):
    results = list(tune_sweep_pause["grid"])
    assert len(results) == 12 and all(r.error is None for r in results)
    budget_flops = C_TOK * tune_sweep_pause["spec"].budget_tokens
    for b in (4, 8):
        mine = [r for r in results if r.config["batch_size_sequences"] == b]
        # 6 trials: 3 pass rung 0 (25 % of the budget), 2 pass rung 1 (50 %) and train their whole budget;
        # the curves differ by a constant (2 + |ln m|), so the survivors are the multipliers closest to 1
        by_dist = sorted(mine, key=lambda r: abs(math.log(r.config["lr_multiplier"])))
        assert [r.metrics.get("pruned_rung") for r in by_dist] == [None, None, 1, 0, 0, 0]
        assert [r.metrics["flops"] for r in by_dist[:2]] == [budget_flops, budget_flops]
        for r in by_dist[2:]:
            m = r.metrics
            assert m["pruned"] is True and m["flops"] == m["pruned_at_flops"] == (0.25, 0.5)[m["pruned_rung"]] * budget_flops
            decisions = m["rung_decisions"].split(";")
            assert len(decisions) == m["pruned_rung"] + 1 and ":stop(" in decisions[-1]
            assert all(":continue(" in d for d in decisions[:-1])


def test_tune_pause_pruned_trials_reach_optuna_and_mlflow(tune_sweep_pause):
    results = list(tune_sweep_pause["grid"])
    for b in (4, 8):
        study = optuna.load_study(study_name=f"tune-pause-B{b}", storage=tune_sweep_pause["storage"])
        states = [t.state for t in study.get_trials(deepcopy=False)]
        assert states.count(optuna.trial.TrialState.PRUNED) == 4 and states.count(optuna.trial.TrialState.COMPLETE) == 2
    tracker = tune_sweep_pause["tracker"]
    children = tracker.client.search_runs([tracker.experiment_id], filter_string="tags.`critbatch.role` = 'trial'")
    by_trial = {r.data.tags["critbatch.trial_id"]: r for r in children}
    assert len(by_trial) == 12
    for r in results:
        tags = by_trial[r.metrics["trial_id"]].data.tags
        assert tags["critbatch.status"] == ("PRUNED" if r.metrics.get("pruned") else "COMPLETED")
        if r.metrics.get("pruned"):
            assert float(tags["critbatch.pruned_at_flops"]) == r.metrics["pruned_at_flops"]
    saved = json.loads((tune_sweep_pause["tmp"] / "pruned_while_paused.json").read_text())
    assert set(saved) <= {r.metrics["trial_id"] for r in results if r.metrics.get("pruned")}
    assert len(saved) >= 4  # most are pruned while they wait (the last to arrive is stopped as it reports)


def test_tune_pause_mode_refuses_tunes_concurrency_limiter(ray_local, tmp_path):
    """Tune's limiter counts paused trials as running: with it, pause mode would wait forever."""
    from ray import tune

    from sweeps.pruning.scheduler import EqualComputeScheduler

    scheduler = EqualComputeScheduler(budget_tokens=1000, mode="pause", trials_per_group=2)
    tuner = tune.Tuner(
        tune.with_resources(synthetic_trainable, {"cpu": 0.5}),
        param_space={"_budget_tokens": 1000, "lr_multiplier": tune.grid_search([1.0, 2.0]), "batch_size_sequences": 4},
        tune_config=tune.TuneConfig(scheduler=scheduler, max_concurrent_trials=1, metric="val_loss", mode="min"),
        run_config=tune.RunConfig(name="limiter", storage_path=str(tmp_path), verbose=0, callbacks=[scheduler.annotator()]),
    )
    with pytest.raises(Exception, match="max_concurrent_trials"):
        tuner.fit()


def test_tune_budget_stopper_ends_the_experiment(ray_local, tmp_path):
    from ray import tune

    from sweeps.search.budget import SweepBudgetStopper

    budget_tokens = 1000
    stopper = SweepBudgetStopper(2.5 * C_TOK * budget_tokens)
    tuner = tune.Tuner(
        tune.with_resources(synthetic_trainable, {"cpu": 0.5}),
        param_space={"_budget_tokens": budget_tokens, "lr_multiplier": tune.grid_search([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])},
        tune_config=tune.TuneConfig(max_concurrent_trials=1),
        run_config=tune.RunConfig(name="budget", storage_path=str(tmp_path), stop=stopper, verbose=0),
    )
    grid = tuner.fit()
    spent = sum(r.metrics.get("flops", 0.0) for r in grid if r.metrics)
    assert stopper.exhausted
    assert 2.5 * C_TOK * budget_tokens <= spent < 3.5 * C_TOK * budget_tokens
    assert sum(1 for r in grid if r.metrics and r.metrics.get("flops") == C_TOK * budget_tokens) == 2


def test_reaper_removes_placement_groups_of_dead_creators_only(ray_local):
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    from sweeps.run.reaper import PlacementGroupReaper

    @ray.remote(num_cpus=0)
    class Controller:  # stands for a Ray Train controller that creates its workers' placement group
        def make(self):
            pg = placement_group([{"CPU": 0.5}])
            ray.get(pg.ready())
            return pg

    mine = placement_group([{"CPU": 0.25}])  # the driver's own (Tune's trial groups are)
    ray.get(mine.ready())
    c = Controller.remote()
    orphan = ray.get(c.make.remote())
    reaper = PlacementGroupReaper()
    assert reaper.reap() == 0  # its creator is alive
    ray.kill(c)
    for _ in range(50):  # the GCS learns of the death asynchronously
        if reaper.reap():
            break
        time.sleep(0.1)
    assert reaper.removed == [orphan.id.hex()]
    assert placement_group_table(orphan)["state"] == "REMOVED"
    assert placement_group_table(mine)["state"] == "CREATED"
    remove_placement_group(mine)


def test_reaper_removes_groups_whose_creator_died_with_its_trial_group_even_if_the_flag_is_unset(ray_local):
    """A controller that dies because its trial's placement group was removed (Tune pausing or stopping
    the trial) while it creates a group: some of its groups keep ``creator_actor_dead = False`` (Ray
    2.60), and a pause-mode sweep then waited forever for their CPUs (2026-12-02). All must go."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from sweeps._compat import placement_group_table
    from sweeps.run.reaper import PlacementGroupReaper

    @ray.remote(num_cpus=0.001)
    class Controller:  # creates groups without pause, as a controller restarting its worker group does
        def spin(self):
            import threading

            def loop():
                while True:
                    placement_group([{"CPU": 0.001}])
            threading.Thread(target=loop, daemon=True).start()

    trial = placement_group([{"CPU": 0.01}])
    ray.get(trial.ready())
    c = Controller.options(scheduling_strategy=PlacementGroupSchedulingStrategy(trial)).remote()
    ray.get(c.spin.remote())
    time.sleep(0.5)  # let it create some groups; how many does not matter
    remove_placement_group(trial)  # kills the controller, as Tune removing a paused trial's group does
    cid = c._actor_id.binary()

    def live():
        return [pg for pg in placement_group_table() if pg.creator_actor_id == cid and pg.state != pg.REMOVED]

    reaper = PlacementGroupReaper()
    for _ in range(100):  # the controller's death, then each removal, reach the GCS asynchronously
        reaper.reap()
        if not live():
            break
        time.sleep(0.1)
    assert reaper.removed and not live()


# ---- CLI level: a real pruned sweep ---------------------------------------------------------------------


def _run(args, timeout=900):
    return run_cli(args, timeout_s=timeout)


@pytest.fixture(scope="module")
def cli_sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pruned")
    d = yaml.safe_load(TINY.read_text())
    d["name"] = "tiny-pruned"
    d["eval"] = {"milestones": 8, "eval_tokens": 1024}
    d["search"] |= {"batch_sizes_sequences": [4, 8], "trials_per_batch_size": 4, "lr_multiplier": [0.05, 20.0]}
    d["resources"] = {"max_concurrent_trials": 2}
    d["pruning"] = {"enabled": True, "grace_fraction": 0.25, "reduction_factor": 2, "min_trials_per_rung": 2}
    spec = write_spec(tmp, d)
    out = tmp / "out"
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    r = _run(["run", str(spec), "--output", str(out), "--tracking-uri", uri, "--sweep-id", "pruned-it", "--no-progress"])
    return {"result": r, "out": out, "uri": uri}


def test_cli_pruned_sweep_succeeds_with_every_batch_size(cli_sweep):
    r = cli_sweep["result"]
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    cbs = json.loads((cli_sweep["out"] / "cbs.json").read_text())
    assert cbs["trials"]["PRUNED"] >= 1
    assert cbs["trials"]["COMPLETED"] + cbs["trials"]["PRUNED"] + cbs["trials"]["DIVERGED"] == 8
    assert [p["batch_size_sequences"] for p in cbs["per_batch"]] == [4, 8]


def test_cli_pause_mode_keeps_one_trial_per_batch_size_and_resumes_from_checkpoints(cli_sweep):
    """The spec's default mode, "pause": 4 trials per batch size, rungs at 25 % and 50 %, the top half goes on."""
    trials = json.loads((cli_sweep["out"] / "trials.json").read_text())
    for b in (4, 8):
        mine = [t for t in trials if t["batch_size_sequences"] == b]
        assert len(mine) == 4
        if not any(t["status"] == "DIVERGED" for t in mine):
            assert sorted(t["status"] for t in mine) == ["COMPLETED", "PRUNED", "PRUNED", "PRUNED"]
            assert sorted(t["tokens"][-1] for t in mine) == [2048, 2048, 4096, 8192]
    # a promoted trial went on from its checkpoint at the rung: every milestone once, in order
    for t in trials:
        assert t["tokens"] == [1024 * (i + 1) for i in range(len(t["tokens"]))]


def test_cli_pruned_trials_stop_at_a_rung(cli_sweep):
    trials = json.loads((cli_sweep["out"] / "trials.json").read_text())
    pruned = [t for t in trials if t["status"] == "PRUNED"]
    assert pruned
    for t in pruned:
        last_tokens = t["tokens"][-1]
        assert 0.25 * 8192 <= last_tokens < 8192  # stopped at the first milestone at or past a rung


def test_cli_pruned_trials_are_pruned_in_the_optuna_study(cli_sweep):
    trials = json.loads((cli_sweep["out"] / "trials.json").read_text())
    storage = f"sqlite:///{cli_sweep['out'] / 'optuna.db'}"
    for b in (4, 8):
        study = optuna.load_study(study_name=f"pruned-it-B{b}", storage=storage)
        states = [t.state for t in study.get_trials(deepcopy=False)]
        expected = sum(1 for t in trials if t["batch_size_sequences"] == b and t["status"] == "PRUNED")
        assert states.count(optuna.trial.TrialState.PRUNED) == expected


def test_cli_pruned_trials_have_the_decision_tags_in_mlflow(cli_sweep):
    trials = {t["trial_id"]: t for t in json.loads((cli_sweep["out"] / "trials.json").read_text())}
    c = MlflowClient(cli_sweep["uri"])
    exp = c.get_experiment_by_name("tiny-pruned")
    children = c.search_runs([exp.experiment_id], filter_string="tags.`critbatch.role` = 'trial'")
    assert len(children) == 8
    for run in children:
        tags = run.data.tags
        t = trials[tags["critbatch.trial_id"]]
        assert tags["critbatch.status"] == t["status"]
        if t["status"] == "PRUNED":
            assert float(tags["critbatch.pruned_at_flops"]) <= t["flops"][-1]
            assert int(tags["critbatch.pruned_rung"]) in (0, 1)
            assert ":stop(" in tags["critbatch.rung_decisions"]
        else:
            assert "critbatch.pruned_at_flops" not in tags


def test_cli_pruned_cbs_json_counts_pruned_curves_in_the_minimum(cli_sweep):
    """Steps to target are the minimum over every trial of a batch size, pruned ones included
    (their curve up to the rung); ``critbatch analyze --trials`` reproduces cbs.json."""
    from tests.cbs_checks import assert_analyze_trials_reproduces_cbs_json, assert_steps_are_minimum_over_trials

    assert cli_sweep["result"].returncode == 0
    assert assert_steps_are_minimum_over_trials(cli_sweep["out"]) >= 2
    assert_analyze_trials_reproduces_cbs_json(cli_sweep["out"])
