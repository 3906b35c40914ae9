"""Trial runners (sweeps/launch/runners.py, workloads/ray/runner.py): the exchange's rules, the per-trial
checkpoints, and real runners on the suite's Ray head (no state carried from one trial to the next,
memory that does not grow)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from sweeps.launch.exchange import TrialExchange


def _ex(max_failures: int = 2, stale_after_s: float = 120.0) -> TrialExchange:
    return TrialExchange(max_failures, stale_after_s=stale_after_s)


def test_trials_are_taken_in_order_and_their_reports_reach_the_relay():
    ex = _ex()
    a, b = ex.submit("a", {"x": 1}), ex.submit("b", {"x": 2})
    assert ex.take("r0") == (a, {"x": 1})
    assert ex.take("r1") == (b, {"x": 2})
    assert ex.take("r2") is None  # nothing queued
    assert ex.report(a, {"tokens_seen": 1.0}) is True
    assert ex.poll(a, 0) == ([{"tokens_seen": 1.0}], "running", None)
    ex.finish(a)
    assert ex.poll(a, 1) == ([], "done", None)
    assert ex.take("r0") is None  # a finished trial is not handed out again


def test_a_trial_that_fails_is_retried_until_its_max_failures_then_ends_with_its_error():
    ex = _ex(max_failures=2)
    t = ex.submit("a", {})
    assert ex.take("r0")[0] == t
    for attempt in (1, 2):  # the runner asks again with the trial in flight: a failure, retried
        ex.failed("r0", t, f"boom {attempt}")
        assert ex.take("r0") == (t, {})
    ex.failed("r0", t, "boom 3")
    assert ex.take("r0") is None  # the third failure is past max_failures=2
    rows, state, error = ex.poll(t, 0)
    assert state == "failed" and error == "boom 3"


def test_a_restarted_worker_group_gets_its_trial_back_and_the_restart_counts_against_that_trial_only():
    ex = _ex(max_failures=1)
    a, b = ex.submit("a", {}), ex.submit("b", {})
    assert ex.take("r0")[0] == a and ex.take("r1")[0] == b
    assert ex.take("r0")[0] == a  # r0's group restarted: a again (1 failure, allowed)
    ex.finish(b)  # r1's trial is untouched by r0's failures
    assert ex.poll(b, 0)[1] == "done"
    assert ex.take("r0") is None and ex.poll(a, 0)[1] == "failed"  # a second restart: past max_failures=1


def test_a_cancelled_or_resubmitted_trial_stops_at_its_next_report_and_close_shuts_every_runner_down():
    ex = _ex()
    old = ex.submit("a", {"v": 1})
    assert ex.take("r0")[0] == old
    new = ex.submit("a", {"v": 2})  # Tune restarted the trial's relay: the old ticket is dropped
    assert ex.report(old, {"tokens_seen": 1.0}) is False
    assert ex.take("r0") == (new, {"v": 2})  # the runner's next ask is the new ticket, no failure counted
    ex.cancel(new)
    assert ex.report(new, {}) is False
    queued = ex.submit("b", {})
    ex.close()
    assert ex.take("r0") == "shutdown" and ex.poll(queued, 0)[1] == "cancelled"


def test_trials_that_tune_paused_or_ended_are_cancelled_by_id_and_a_waiting_runner_sees_it():
    ex = _ex()
    a, b = ex.submit("a", {}), ex.submit("b", {})
    ex.take("r0")
    assert ex.alive(a) and not ex.alive(b)  # b is queued, not running
    assert ex.cancel_trials(["a", "b", "zzz"]) == 2
    assert not ex.alive(a) and ex.report(a, {}) is False and ex.take("r1") is None
    again = ex.submit("a", {})  # Tune resumed the paused trial: a new ticket, taken by any runner
    assert ex.take("r1") == (again, {}) and ex.alive(again)


def test_a_trial_whose_relay_sent_no_heartbeat_fails_and_a_heartbeat_keeps_it():
    ex = _ex(stale_after_s=0.05)
    gone, beating = ex.submit("a", {}), ex.submit("b", {})
    for _ in range(3):  # b's relay is blocked handing a report to Tune, but its heartbeat thread beats
        time.sleep(0.03)
        ex.heartbeat(beating)
    assert ex.take("r0") == (beating, {})
    rows, state, error = ex.poll(gone, 0)
    assert state == "failed" and "no heartbeat" in error  # never a silent, quiet end of the trial


def test_when_every_runner_slot_gave_up_open_and_later_trials_fail_instead_of_waiting():
    ex = _ex()
    ex.set_runners(2)
    a, b = ex.submit("a", {}), ex.submit("b", {})
    ex.take("r0")
    ex.runner_gone("r0", "ImportError: no torch")
    assert ex.poll(a, 0)[1] == "failed" and ex.poll(b, 0)[1] == "queued"  # r1 may still take b
    ex.runner_gone("r1", "ImportError: no torch")
    later = ex.submit("c", {})
    for t in (b, later):
        rows, state, error = ex.poll(t, 0)
        assert state == "failed" and "no trial runner is left" in error and "no torch" in error


def test_an_ended_ticket_forgets_its_rows_once_the_relay_has_them_all():
    ex = _ex()
    t = ex.submit("a", {})
    ex.take("r0")
    ex.report(t, {"tokens_seen": 1.0})
    ex.finish(t)
    assert ex.poll(t, 0) == ([{"tokens_seen": 1.0}], "done", None)
    assert ex.poll(t, 1) == ([], "done", None) and ex._tickets[t].rows == []


def test_a_lost_runner_fails_its_trial_in_flight():
    ex = _ex()
    t = ex.submit("a", {})
    ex.take("r0")
    ex.runner_lost("r0", "ControllerError: gone")
    rows, state, error = ex.poll(t, 0)
    assert state == "failed" and "ControllerError: gone" in error


def test_a_runner_pool_keeps_one_shape_and_a_new_shape_stops_the_kept_runners():
    """The comparison's pool (sweeps.launch.runners.RunnerPool): arms of one shape get the same (unstarted)
    runners; a different worker count, CPU share, retry budget or runner count gets new ones."""
    from types import SimpleNamespace

    from sweeps.launch.runners import RunnerPool, active_pool, shared_runners

    def spec(workers=1, cpus=1.0, failures=2):
        return SimpleNamespace(
            resources=SimpleNamespace(
                workers_per_trial=workers, cpus_per_worker=cpus, gpus_per_worker=0.0, max_failures=failures
            )
        )

    assert active_pool() is None
    with shared_runners("cmp") as pool:
        assert active_pool() is pool and isinstance(pool, RunnerPool)
        first = pool.runners_for(spec(), count=2, storage_path="/x/a/train")
        assert pool.runners_for(spec(), count=2, storage_path="/x/b/train") is first
        assert first.storage_path == "/x/a/train" and first.name.endswith("cmp.runners-1")
        for other in (spec(workers=2), spec(cpus=0.5), spec(failures=3)):
            kept = pool.runners_for(other, count=2, storage_path="/x/c/train")
            assert kept is not first and pool.runners_for(other, count=2, storage_path="/x/d/train") is kept
            first = kept
        assert pool.runners_for(spec(failures=3), count=1, storage_path="/x/e/train") is not first
    assert active_pool() is None


def test_runner_checkpoints_keep_only_the_last_and_a_one_trial_groups_checkpoint_is_read(tmp_path: Path):
    torch = pytest.importorskip("torch")
    from workloads.ray.adapter import STATE_FILE
    from workloads.ray.runner import latest_checkpoint, save_checkpoint

    d = tmp_path / "train-abc"
    assert latest_checkpoint(str(d)) == (None, None)  # nothing yet (the folder does not exist)
    legacy = d / "checkpoint_2026-12-05_10-00-00.000000"
    legacy.mkdir(parents=True)
    torch.save({"loop": {"step": 3}}, legacy / STATE_FILE)
    assert latest_checkpoint(str(d))[1] == {"loop": {"step": 3}}  # a sweep started before runners
    save_checkpoint(str(d), 1, {"loop": {"step": 4}})
    save_checkpoint(str(d), 2, {"loop": {"step": 5}})
    path, state = latest_checkpoint(str(d))
    assert state == {"loop": {"step": 5}} and path.endswith("ckpt-000002/" + STATE_FILE)
    assert sorted(p.name for p in d.iterdir() if p.name.startswith("ckpt-")) == ["ckpt-000002"]
    (d / "ckpt-000003").mkdir()
    (d / "ckpt-000003" / STATE_FILE).write_bytes(b"cut short")  # a store without atomic writes, a crash
    assert latest_checkpoint(str(d))[1] == {"loop": {"step": 5}}  # the one before it, not a failed trial
    assert not [p for p in d.iterdir() if p.name.startswith(".")]  # no temporary folder left


# ---- real runners on the suite's Ray head ---------------------------------------------------------------

_TIMING = {
    "startup_s",
    "startup_ray_s",
    "worker_rss_mb",
    "worker_nodes",
    "wall_s",
    "step_time_s",
    "tokens_per_s",
    "time_total_s",
    "mfu",
    "flops_per_s",
    "eval_s",
}


def _curve(rows: list[dict]) -> list[dict]:
    """A trial's reports without what depends on the clock, the process or the node."""
    return [
        {k: v for k, v in r.items() if k not in _TIMING and not k.endswith("_s") and not k.endswith("_per_s")}
        for r in rows
    ]


def _run(runners, trials: list[tuple[str, dict]], timeout_s: float = 300.0) -> list[list[dict]]:
    """Submit the trials in order to the runners' exchange and wait for each one's reports."""
    import ray

    out = []
    for trial_id, cfg in trials:
        ticket = ray.get(runners.exchange.submit.remote(trial_id, cfg))
        deadline = time.monotonic() + timeout_s
        while True:
            rows, state, error = ray.get(runners.exchange.poll.remote(ticket, 0))
            if state == "done":
                break
            assert state in ("queued", "running"), f"{trial_id}: {state}: {error}"
            assert time.monotonic() < deadline, f"{trial_id} did not end in {timeout_s} s"
            time.sleep(0.05)
        out.append(rows)
    return out


@pytest.mark.slow
def test_a_trial_in_a_reused_runner_gives_the_same_curve_as_in_a_fresh_one_and_memory_does_not_grow(
    ray_head, tiny_spec_dict, tmp_path
):
    """The same trial as the first of a fresh runner and as the third of a reused one: identical curves,
    bit for bit (seeds, RNG states, thread settings, data order: nothing leaks between trials). Then 20
    trials through one runner (and one that raises on every attempt, which ends alone): its worker's
    resident memory after the 5th and after the 20th. Then the same LoRA fine-tuning trial twice in that
    runner: the same curve (the checkpoint is loaded per trial). Last, the runner's Ray Train controller is killed:
    its host starts the slot's run again, which takes the next trial."""
    import ray

    from sweeps.launch.runners import TrialRunners
    from sweeps.launch.trainable import trial_config
    from sweeps.spec import SweepSpec
    from workloads.api import replace

    d = dict(tiny_spec_dict, budget_tokens=4096)
    d["eval"] = {"milestones": 2, "eval_tokens": 512}
    spec = SweepSpec.model_validate(d)
    data = (
        str(Path(d["data"]["path"]).resolve())
        if Path(d["data"]["path"]).is_absolute()
        else str(Path(__file__).resolve().parents[3] / d["data"]["path"])
    )

    def trial(i: int, batch: int, lr: float, seed: int = 0) -> tuple[str, dict]:
        tid = f"t{i:02d}"
        cfg = trial_config(
            spec,
            {
                "batch_size_sequences": batch,
                "lr": lr,
                "lr_rule": "sqrt",
                "beta2": 0.99,
                "beta2_half_life_tokens": 4096.0,
                "seed": seed,
            },
            tid,
            data_path=data,
        )
        return tid, _loop_config(cfg, str(tmp_path / "train" / f"train-{tid}"))

    ray.init(address=ray_head.gcs_address, namespace=f"runners-{uuid.uuid4().hex[:8]}", log_to_driver=False)
    try:
        reused = TrialRunners(
            spec, sweep_id=f"reused-{uuid.uuid4().hex[:6]}", count=1, storage_path=str(tmp_path / "runs")
        ).start()
        a = trial(0, 8, 0.003)
        first = _run(
            reused,
            [
                trial(1, 4, 0.006, seed=1),
                trial(2, 16, 0.001, seed=2),
                (a[0] + "x", _loop_config(a[1]["trial"], a[1]["context"].checkpoint_dir + "x")),
            ],
        )
        bad_id, bad = trial(99, 8, 0.003)
        w = bad["trial"].workload  # a corpus that is not there: raises in the worker, every attempt
        bad = _loop_config(
            replace(bad["trial"], workload=replace(w, data=replace(w.data, path=str(tmp_path / "no-such-corpus.txt")))),
            bad["context"].checkpoint_dir,
        )
        ticket = ray.get(reused.exchange.submit.remote(bad_id, bad))
        more = _run(reused, [trial(i, (4, 8, 16)[i % 3], 0.003, seed=i) for i in range(3, 20)])
        rows, state, error = ray.get(reused.exchange.poll.remote(ticket, 0))
        # fine-tuning in the same warm runner: the checkpoint loaded per trial (a LoRA adapter trained by the first
        # must not be in the second's model), so the same trial twice gives the same curve
        ft = _finetune_trial(tmp_path)
        tuned = _run(
            reused, [(t, _loop_config(replace(ft, trial_id=t), str(tmp_path / f"train-{t}"))) for t in ("ft-a", "ft-b")]
        )
        # a runner whose Ray Train run ends with an error (its controller killed) is started again by its host
        killed = _kill_train_controllers(ray.get_runtime_context().namespace, ray_head.dashboard_url)
        deadline = time.monotonic() + 180  # the next trial once the slot's second run has begun (a trial taken
        while not list((tmp_path / "runs").glob("runner-*-1")) and time.monotonic() < deadline:  # by the dying
            time.sleep(0.5)  # run would fail with it: runner_lost fails the trial in flight)
        after = _run(reused, [trial(20, 8, 0.003, seed=20)])
        assert reused.stop()  # every runner's Ray Train run ended (its groups released)
        fresh = TrialRunners(
            spec, sweep_id=f"fresh-{uuid.uuid4().hex[:6]}", count=1, storage_path=str(tmp_path / "runs2")
        ).start()
        alone = _run(fresh, [a])
        assert fresh.stop()
    finally:
        ray.shutdown()
    assert _curve(first[2]) == _curve(alone[0]) and len(alone[0]) >= 2
    # the trial that raised ended alone, with its error, after max_failures + 1 attempts; the runner went on
    assert state == "failed" and "no-such-corpus" in error and rows == [], (state, error)
    assert {r[0]["worker_nodes"] for r in more} == {first[0][0]["worker_nodes"]} and len(more) == 17
    assert first[0][0]["worker_nodes"] == first[2][0]["worker_nodes"]  # the same runner ran both
    assert len(tuned[0]) == 2 and tuned[0][-1].get("done") and _curve(tuned[0]) == _curve(tuned[1]), tuned
    assert {r[0]["worker_nodes"] for r in tuned} == {first[0][0]["worker_nodes"]}
    rss = [rows[0]["worker_rss_mb"] for rows in first + more]
    assert len(rss) == 20
    print(f"worker RSS (MiB) by trial: {[round(r) for r in rss]}")
    assert rss[19] - rss[4] < 25.0, rss  # MiB over 15 trials; measured: see docs/benchmarks.md
    # the replacement: one controller killed, the slot's second Ray Train run (generation 1) took the next trial
    assert killed == 1 and len(after[0]) >= 2 and after[0][-1].get("done"), (killed, after)
    assert sorted(p.name.rsplit("-", 1)[1] for p in (tmp_path / "runs").glob("runner-*")) == ["0", "1"]


def _loop_config(cfg, checkpoint_dir: str) -> dict:
    """A trial runner's item: the trial, one torch thread, its own checkpoint folder."""
    from workloads.api import TrialRunContext, loop_config

    return loop_config(cfg, TrialRunContext(torch_threads=1, checkpoint_dir=checkpoint_dir))


def _finetune_trial(tmp_path: Path):
    """A fine-tuning trial's config (``sweeps/examples/gsm8k-finetune.yaml`` cut down: LoRA rank 4 on a tiny
    byte-level checkpoint made here, 40 arithmetic questions, 2 milestones of 1536 tokens)."""
    import json

    import yaml

    from sweeps.launch.trainable import trial_config
    from sweeps.spec import SweepSpec
    from workloads.api import init_checkpoint

    root = Path(__file__).resolve().parents[3]
    ckpt = init_checkpoint(
        str(tmp_path / "ft-ckpt"), d_model=32, n_layers=1, n_heads=2, context_length_tokens=128, d_ff=64
    )
    qa = tmp_path / "qa.jsonl"
    qa.write_text(
        "".join(
            json.dumps({"question": f"What is {3 * i + 1} plus {7 * i + 2}?", "answer": f"#### {10 * i + 3}"}) + "\n"
            for i in range(40)
        )
    )
    d = yaml.safe_load((root / "sweeps" / "examples" / "gsm8k-finetune.yaml").read_text())
    d["model"] = {"context_length_tokens": 96}
    d["data"] = {"path": str(qa), "validation_fraction": 0.2}
    d["finetune"].update(checkpoint_dir=str(ckpt), truncate=False, lora={"rank": 4, "alpha": 8})
    d.update(
        budget_tokens=3072,
        schedule={"kind": "constant_ema", "warmup_tokens": 0, "ema_half_life_tokens": 1024},
        eval={"milestones": 2, "eval_tokens": 512},
    )
    d["search"].update(batch_sizes_sequences=[4], base_batch_size_sequences=4)
    spec = SweepSpec.model_validate(d)
    cfg = trial_config(
        spec,
        {
            "batch_size_sequences": 4,
            "lr": 0.003,
            "lr_rule": "sqrt",
            "beta2": 0.99,
            "beta2_half_life_tokens": 4096.0,
            "seed": 0,
        },
        "ft",
        data_path=str(qa),
    )
    return cfg


def _kill_train_controllers(namespace: str, dashboard_url: str) -> int:
    """SIGKILL the process of every live Ray Train controller whose job runs in ``namespace`` on the cluster
    whose dashboard is ``dashboard_url`` (named: with several Ray instances on the machine the state API
    cannot guess which); how many."""
    import os
    import signal

    from ray.util.state import list_actors

    actors = list_actors(
        address=dashboard_url, filters=[("class_name", "=", "TrainController"), ("state", "=", "ALIVE")], detail=True
    )
    mine = [a for a in actors if getattr(a, "ray_namespace", None) == namespace]
    for a in mine:
        os.kill(a.pid, signal.SIGKILL)
    return len(mine)
