"""Equal-compute pruning through real Ray Tune, Optuna RDB storage and MLflow (no mocks).

Two levels:

* ``test_tune_*``: the scheduler, its annotator, the ``BatchSizeSearcher`` (Optuna studies in SQLite),
  the MLflow callback and the budget stopper inside a real ``Tuner``, with a function trainable that
  reports synthetic loss curves (seconds, no Ray Train).
* ``test_cli_*``: a tiny pruned sweep through ``python -m critbatch run`` (real training).
"""

from __future__ import annotations

import json
import math
import os
import sys

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, TINY, run_cli, write_spec
from tests.harness import copy_mlflow_store, wait_for

#: about 3x the idle time of the slowest Tune-level test with its fixture: ~25 s on the 2-core machine
#: (the first also starts the suite's Ray head and MLflow template); 62 s at load average ~17
TUNE_TIMEOUT_S = 90
#: about 3x the idle time of the CLI sweep ``cli_sweep``: 94 s (4 trials, three trial starts in a row:
#: two, two more, the two promoted again); 330 s at load average ~17
CLI_TIMEOUT_S = 300

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TUNE_TIMEOUT_S)]
#: the CLI tests: whichever runs first pays for the module's sweep (``cli_sweep``)
cli_timeout = pytest.mark.timeout(CLI_TIMEOUT_S)

CLI = [sys.executable, "-m", "critbatch"]


# ---- Tune level: synthetic curves ----------------------------------------------------------------------

C_TOK = 1.0e6


def synthetic_trainable(config):
    """Reports 8 milestones of a loss curve whose level depends on the LR multiplier's distance from 1."""
    from ray import tune

    budget = config["_budget_tokens"]
    level = 2.0 + abs(math.log(config["lr_multiplier"]))
    for i in range(1, 9):
        f = i / 8
        loss = level + 0.5 * f**-0.5
        done = i == 8
        tune.report(
            {
                "tokens_seen": f * budget,
                "flops": C_TOK * f * budget,
                "val_loss": loss,
                "objective": loss,
                "status": "completed" if done else "running",
                "done": done,
            }
        )


@pytest.fixture(scope="module")
def ray_local(ray_head):
    """This process as a driver on the suite's Ray head (nothing here needs Ray's own lifecycle)."""
    import ray
    from ray import cloudpickle

    # the synthetic trainable lives in this test module, which Ray's workers cannot import by name
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    started = not ray.is_initialized()
    if started:
        ray.init(address=ray_head.gcs_address, log_to_driver=False)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def _tune_sweep(tmp, mode: str, study_prefix: str, mlflow_template) -> dict:
    """A real Tuner over 2 batch sizes x 6 synthetic trials with the scheduler in ``mode``.

    Mode "stop" uses Tune's concurrency limiter; mode "pause" gives the searcher the scheduler's gate
    instead (the limiter would count paused trials as running)."""
    from ray import tune

    from sweeps.pruning.scheduler import EqualComputeScheduler
    from sweeps.search.searcher import BatchSizeSearcher
    from sweeps.spec import parse_spec
    from sweeps.tracking.writer import MlflowTracker, MlflowTrialCallback

    d = yaml.safe_load(TINY.read_text())
    d["data"]["path"] = str(ROOT / "data" / "tinyshakespeare" / "input.txt")
    d["search"] |= {"batch_sizes_sequences": [4, 8], "trials_per_batch_size": 6, "lr_multiplier": [0.1, 10.0]}
    d["pruning"] = {"enabled": True, "mode": mode}
    d["resources"] = {"max_concurrent_trials": 2}
    spec = parse_spec(d)
    tracker = MlflowTracker(MlflowClient(copy_mlflow_store(mlflow_template, tmp / "mlflow.db")), spec, study_prefix)
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
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            scheduler=scheduler,
            num_samples=spec.n_trials,
            max_concurrent_trials=2 if mode == "stop" else None,
        ),
        run_config=tune.RunConfig(
            name="tune",
            storage_path=str(tmp),
            verbose=0,
            callbacks=[scheduler.annotator(), MlflowTrialCallback(tracker, lambda cfg: {})],
        ),
    )
    grid = tuner.fit()
    tracker.outbox.drain(timeout_s=30)
    return {"grid": grid, "tmp": tmp, "storage": storage, "tracker": tracker, "spec": spec, "scheduler": scheduler}


@pytest.fixture(scope="module")
def tune_sweep(ray_local, tmp_path_factory, mlflow_template):
    return _tune_sweep(tmp_path_factory.mktemp("tune"), "stop", "tune-it", mlflow_template)


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
    full = {
        r.config["batch_size_sequences"]
        for r in results
        if not r.metrics.get("pruned") and r.metrics["flops"] == budget_flops
    }
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
def tune_sweep_pause(ray_local, tmp_path_factory, mlflow_template):
    """Mode "pause" in a real Tuner: the scheduler gates the searcher, pauses and resumes real Tune trials."""
    return _tune_sweep(tmp_path_factory.mktemp("tune-pause"), "pause", "tune-pause", mlflow_template)


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
            assert (
                m["pruned"] is True
                and m["flops"] == m["pruned_at_flops"] == (0.25, 0.5)[m["pruned_rung"]] * budget_flops
            )
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
        run_config=tune.RunConfig(
            name="limiter", storage_path=str(tmp_path), verbose=0, callbacks=[scheduler.annotator()]
        ),
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
        param_space={
            "_budget_tokens": budget_tokens,
            "lr_multiplier": tune.grid_search([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        },
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

    from sweeps.launch.reaper import PlacementGroupReaper

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
    reaper.reap()  # on the suite's shared head it may remove what earlier sweeps left (any job's dead creator's)
    assert orphan.id.hex() not in reaper.removed and mine.id.hex() not in reaper.removed  # its creator is alive
    ray.kill(c)
    # the GCS learns of the death asynchronously; on the suite's shared head a pass may first remove what earlier
    # sweeps left (any job's dead creator's), so wait for this group by its id, not for any removal
    wait_for(
        lambda: reaper.reap() >= 0 and orphan.id.hex() in reaper.removed,
        60,
        "the reaper to see the dead controller's group",
    )
    assert mine.id.hex() not in reaper.removed
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

    from sweeps._compat import actor_is_dead, placement_group_table
    from sweeps.launch.reaper import PlacementGroupReaper

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
    cid = c._actor_id.binary()

    def live():
        return [pg for pg in placement_group_table() if pg.creator_actor_id == cid and pg.state != pg.REMOVED]

    ray.get(c.spin.remote())
    wait_for(live, 60, "the controller's first placement group in the GCS")  # how many more does not matter
    remove_placement_group(trial)  # kills the controller, as Tune removing a paused trial's group does
    wait_for(lambda: actor_is_dead(cid), 60, "the controller's death")

    reaper = PlacementGroupReaper()
    # each removal, and the groups the dying controller was still creating, reach the GCS asynchronously
    wait_for(lambda: reaper.reap() >= 0 and not live(), 60, "no live group of the dead controller")
    assert reaper.removed and not live()


_LEAKING_DRIVER = """
import sys, time, ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from sweeps._compat import actor_is_dead, placement_group_table

ray.init(address=sys.argv[1], log_to_driver=False)

@ray.remote(num_cpus=0.001)
class Controller:
    def spin(self):
        import threading
        def loop():
            while True:
                placement_group([{"CPU": 0.001}])
        threading.Thread(target=loop, daemon=True).start()

trial = placement_group([{"CPU": 0.01}])
ray.get(trial.ready())
c = Controller.options(scheduling_strategy=PlacementGroupSchedulingStrategy(trial)).remote()
cid = c._actor_id.binary()
ray.get(c.spin.remote())
deadline = time.monotonic() + 60
while not [pg for pg in placement_group_table() if pg.creator_actor_id == cid] and time.monotonic() < deadline:
    time.sleep(0.05)
remove_placement_group(trial)
while not actor_is_dead(cid) and time.monotonic() < deadline:
    time.sleep(0.05)
print(cid.hex(), flush=True)
sys.stdin.read()  # the job stays alive until the test has reaped
"""


def test_the_reaper_removes_another_finished_jobs_orphaned_groups(ray_local, ray_head):
    """Seen in the suite on 2026-12-05: groups a dead controller left with ``creator_actor_dead = False``
    outlive their job (Ray never removes them), and on a shared head three such groups held all 3 CPUs,
    so the next sweeps waited until their timeouts. The reaper of a later sweep (another job) must remove
    them. The leaking job here is a driver process of its own that makes the controller die, its job still
    running while this test's reaper (another job) removes what it left."""
    import subprocess

    import ray

    from sweeps._compat import actor_is_dead, placement_group_table
    from sweeps.launch.reaper import PlacementGroupReaper

    proc = subprocess.Popen(
        [sys.executable, "-c", _LEAKING_DRIVER, ray_head.gcs_address],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=str(ROOT),
        env=dict(os.environ, RAY_AUTH_MODE="disabled"),
    )
    try:
        line = proc.stdout.readline()  # the controller's id, once it is dead: its job goes on
        assert line.strip(), "the leaking driver printed no controller id"
        cid = bytes.fromhex(line.strip())
        assert actor_is_dead(cid)
        mine = ray.get_runtime_context().get_job_id()

        def live():
            return [pg for pg in placement_group_table() if pg.creator_actor_id == cid and pg.state != pg.REMOVED]

        reaper = PlacementGroupReaper()
        wait_for(lambda: reaper.reap() >= 0 and not live(), 60, "no live group of the other job's dead controller")
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    assert reaper.removed, "the other job's controller left no orphaned group, so nothing was tested"
    assert all(
        pg.creator_job_id.hex() != mine
        for pg in placement_group_table()
        if ray.PlacementGroupID(pg.placement_group_id).hex() in reaper.removed
    )


# ---- CLI level: a real pruned sweep ---------------------------------------------------------------------


def _run(args, timeout=CLI_TIMEOUT_S - 60):  # fails with the CLI's output before pytest-timeout would
    return run_cli(args, timeout_s=timeout)


@pytest.fixture(scope="module")
def cli_sweep(tmp_path_factory, ray_head, mlflow_template):
    """2 batch sizes x 2 trials in mode "pause" on the suite's Ray head: at rung 0 (25 %) the two trials
    of a batch size are compared and one is pruned; the other trains its whole budget. 2 per batch size
    is the least that prunes anything (``min_trials_per_rung: 2``: a rung with one value keeps it)."""
    tmp = tmp_path_factory.mktemp("pruned")
    d = yaml.safe_load(TINY.read_text())
    d["name"] = "tiny-pruned"
    d["eval"] = {"milestones": 8, "eval_tokens": 1024}
    d["search"] |= {"batch_sizes_sequences": [4, 8], "trials_per_batch_size": 2, "lr_multiplier": [0.25, 4.0]}
    d["resources"] = {"max_concurrent_trials": 2}
    d["pruning"] = {"enabled": True, "grace_fraction": 0.25, "reduction_factor": 2, "min_trials_per_rung": 2}
    spec = write_spec(tmp, d)
    out = tmp / "out"
    uri = copy_mlflow_store(mlflow_template, tmp / "mlflow.db")
    r = _run(
        [
            "run",
            str(spec),
            "--output",
            str(out),
            "--tracking-uri",
            uri,
            "--sweep-id",
            "pruned-it",
            "--no-progress",
            "--address",
            ray_head.gcs_address,
        ]
    )
    return {"result": r, "out": out, "uri": uri}


@cli_timeout
def test_cli_pruned_sweep_succeeds_with_every_batch_size(cli_sweep):
    r = cli_sweep["result"]
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    cbs = json.loads((cli_sweep["out"] / "cbs.json").read_text())
    assert cbs["trials"] == {"COMPLETED": 2, "PRUNED": 2, "DIVERGED": 0, "FAILED": 0, "STOPPED": 0}
    assert [p["batch_size_sequences"] for p in cbs["per_batch"]] == [4, 8]


def _restarts(out, trial_id: str) -> int:
    """How often a trial started again from a checkpoint: a restarted trial first sends the reports
    of its checkpoint again (workloads/ray/adapter.py), so its report log goes back in tokens."""
    rows = [
        json.loads(line) for line in (out / "reports" / f"{trial_id}.jsonl").read_text().splitlines() if line.strip()
    ]
    return sum(1 for a, b in zip(rows, rows[1:]) if b["tokens_seen"] <= a["tokens_seen"])


@cli_timeout
def test_cli_pause_mode_keeps_one_trial_per_batch_size_and_resumes_from_checkpoints(cli_sweep):
    """The spec's default mode, "pause": 2 trials per batch size, the better one at rung 0 (25 %) goes
    on, alone from there (rung 1 has nobody to compare it with); nothing diverges with multipliers in
    [0.25, 4]. The first trial of a batch size reaches rung 0 while the second is still starting, so it
    waits paused there; promoted, it resumes from its checkpoint."""
    out = cli_sweep["out"]
    trials = json.loads((out / "trials.json").read_text())
    for b in (4, 8):
        mine = [t for t in trials if t["batch_size_sequences"] == b]
        assert sorted(t["status"] for t in mine) == ["COMPLETED", "PRUNED"]
        assert sorted(t["tokens"][-1] for t in mine) == [2048, 8192]
    # the seeded sampler's first suggestion wins rung 0 at B = 8 (multiplier 2.8 against 0.8; at B = 4
    # the two are close): at least one promoted trial waited at the rung and went on from its checkpoint
    resumed = [t for t in trials if t["status"] == "COMPLETED" and _restarts(out, t["trial_id"]) == 1]
    assert resumed, [(t["trial_id"], t["status"], _restarts(out, t["trial_id"])) for t in trials]
    # ... and its curve has every milestone once, in order (the re-sent reports are not doubled)
    for t in trials:
        assert t["tokens"] == [1024 * (i + 1) for i in range(len(t["tokens"]))]


@cli_timeout
def test_cli_pruned_trials_stop_at_a_rung(cli_sweep):
    trials = json.loads((cli_sweep["out"] / "trials.json").read_text())
    pruned = [t for t in trials if t["status"] == "PRUNED"]
    assert len(pruned) == 2
    for t in pruned:
        # stopped at the milestone of its rung (25 % or 50 % of 8192 tokens; milestones every 1024)
        assert t["tokens"][-1] in (0.25 * 8192, 0.5 * 8192)
        assert t["pruning"]["pruned_at_flops"] == t["flops"][-1]


@cli_timeout
def test_cli_pruned_trials_are_pruned_in_the_optuna_study(cli_sweep):
    trials = json.loads((cli_sweep["out"] / "trials.json").read_text())
    storage = f"sqlite:///{cli_sweep['out'] / 'optuna.db'}"
    for b in (4, 8):
        study = optuna.load_study(study_name=f"pruned-it-B{b}", storage=storage)
        states = [t.state for t in study.get_trials(deepcopy=False)]
        expected = sum(1 for t in trials if t["batch_size_sequences"] == b and t["status"] == "PRUNED")
        assert expected == 1
        assert sorted(states, key=str) == sorted(
            [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED], key=str
        )


@cli_timeout
def test_cli_pruned_trials_have_the_decision_tags_in_mlflow(cli_sweep):
    trials = {t["trial_id"]: t for t in json.loads((cli_sweep["out"] / "trials.json").read_text())}
    c = MlflowClient(cli_sweep["uri"])
    exp = c.get_experiment_by_name("tiny-pruned")
    children = c.search_runs([exp.experiment_id], filter_string="tags.`critbatch.role` = 'trial'")
    assert len(children) == 4
    assert sorted(run.data.tags["critbatch.status"] for run in children) == [
        "COMPLETED",
        "COMPLETED",
        "PRUNED",
        "PRUNED",
    ]
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


@cli_timeout
def test_cli_pruned_cbs_json_counts_pruned_curves_in_the_minimum(cli_sweep, tmp_path):
    """Steps to target are the minimum over every trial of a batch size, pruned ones included
    (their curve up to the rung); ``critbatch analyze --trials`` reproduces cbs.json."""
    from sweeps.analysis import analyze_trials_file, finite_json
    from tests.cbs_checks import assert_analyze_trials_reproduces_cbs_json, assert_steps_are_minimum_over_trials

    out = cli_sweep["out"]
    assert cli_sweep["result"].returncode == 0
    assert assert_steps_are_minimum_over_trials(out) >= 2
    assert_analyze_trials_reproduces_cbs_json(out)
    # With multipliers in [0.25, 4] the promoted trial is also the faster one before the rung, so no
    # pruned curve is a minimum in this sweep's cbs.json and the checks above would pass with pruned
    # trials left out. So: the sweep's own records, each pruned curve moved 0.05 nats below its batch
    # size's completed one, analysed at the sweep's targets: now a pruned trial must give a point.
    trials = json.loads((out / "trials.json").read_text())
    cbs = json.loads((out / "cbs.json").read_text())
    done = {t["batch_size_sequences"]: t for t in trials if t["status"] == "COMPLETED"}
    for t in trials:
        if t["status"] == "PRUNED":
            full = done[t["batch_size_sequences"]]
            t["val_loss"] = [full["val_loss"][full["tokens"].index(x)] - 0.05 for x in t["tokens"]]
    (tmp_path / "trials.json").write_text(json.dumps(trials))
    (tmp_path / "cbs.json").write_text(json.dumps(cbs))
    moved = finite_json(
        analyze_trials_file(tmp_path / "trials.json", targets=[e["target_loss"] for e in cbs["targets"]])
    )
    (tmp_path / "cbs.json").write_text(json.dumps(moved))
    assert assert_steps_are_minimum_over_trials(tmp_path) >= 2
    pruned_ids = {t["trial_id"] for t in trials if t["status"] == "PRUNED"}
    assert any(p["trial_id"] in pruned_ids for e in moved["targets"] for p in e["points"])
