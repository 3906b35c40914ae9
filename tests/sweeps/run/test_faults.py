"""Faults injected into real sweeps: a killed Train worker, a killed driver, an MLflow outage.

See docs/reliability.md for what each test injects and what must survive.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, write_spec
from tests.harness import copy_mlflow_store, free_port
from workloads.testing.faults import HOLD_HOOKS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(720)]  # each 1-4 min idle
CLI = [sys.executable, "-m", "critbatch"]
RAY = os.path.join(os.path.dirname(sys.executable), "ray")
ENV = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")


def wait_for(pred, timeout_s: float, what: str, interval_s: float = 0.5, diagnose=None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval_s)
    extra = f"\n{diagnose()}" if diagnose else ""
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}{extra}")


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def stop_group(proc: subprocess.Popen, first: signal.Signals = signal.SIGTERM) -> None:
    """``first`` to ``proc``'s process group, SIGKILL after 30 s (a Ray head: :func:`stop_head`)."""
    for sig in (first, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=30)
            return
        except subprocess.TimeoutExpired:
            continue


def start_ray_head(env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """An external Ray head (3 CPUs) in its own process group; returns it and its address once it listens.

    Every port it opens lies outside 10002-19999 (``ray start``'s default worker ports, which other
    Ray clusters on a shared machine use): workers get a random 1000-port window in 20000-29999, the
    other servers free ports. ``env``: its environment (default :data:`ENV`), which its trials inherit.
    Stop it with :func:`stop_group` (``ray stop`` would stop every cluster on the machine)."""
    port = free_port()
    workers = 20000 + 1000 * random.randrange(10)
    temp = tempfile.mkdtemp(prefix="cbf", dir="/tmp")  # short: Ray's socket paths are length-limited
    head = subprocess.Popen(
        [
            RAY,
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--num-cpus=3",
            f"--min-worker-port={workers}",
            f"--max-worker-port={workers + 999}",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            "--disable-usage-stats",
            "--include-dashboard=false",
            f"--temp-dir={temp}",
        ],
        env=env or ENV,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: port_open(port), 120, "the Ray head")
    except BaseException:
        stop_head(head)
        raise
    return head, f"127.0.0.1:{port}"


def stop_head(head: subprocess.Popen) -> None:
    """Stop a head from :func:`start_ray_head`: SIGKILL to its process group. A test's head is thrown away,
    and a graceful stop cost up to 33 s (``ray start --block`` on SIGTERM; on SIGINT 1.5 s in one run and
    30 s in another); its workers exit when their raylet dies."""
    stop_group(head, first=signal.SIGKILL)


def spec_dict(**over) -> dict:
    d = yaml.safe_load((ROOT / "tests" / "specs" / "tiny.yaml").read_text())
    d["data"]["path"] = str(ROOT / "data" / "tinyshakespeare" / "input.txt")
    d.update(over)
    return d


def result_rows(out: Path) -> list[dict]:
    """Every row of the sweep's Tune ``result.json`` files (``OUT/tune/<sweep id>/<trial>/``)."""
    rows = []
    for f in sorted((out / "tune").glob("**/result.json")):
        rows += [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    return rows


def pids_named(fragment: str) -> list[int]:
    r = subprocess.run(["pgrep", "-f", fragment], capture_output=True, text=True)
    return [int(x) for x in r.stdout.split()]


def children(run_uri: str, experiment: str):
    c = MlflowClient(run_uri)
    exp = c.get_experiment_by_name(experiment)
    runs = c.search_runs([exp.experiment_id], max_results=1000)
    return (
        c,
        [r for r in runs if r.data.tags.get("critbatch.role") == "sweep"],
        [r for r in runs if r.data.tags.get("critbatch.role") == "trial"],
    )


def test_killed_training_worker_resumes_from_checkpoint(tmp_path, ray_head, mlflow_uri):
    """kill -9 the Ray Train worker after its second milestone: the trial restarts the worker group
    from the last checkpoint and finishes with one continuous MLflow run (on the suite's head: the hold
    reaches the worker through the job's runtime env, and the worker killed is the one that appeared
    after the sweep started)."""
    d = spec_dict(name="fault-worker", budget_tokens=16384)
    d["search"].update(batch_sizes_sequences=[8], lr_rules=["sqrt"], lr_multiplier=[1, 1], beta2={"values": [0.99]})
    d["eval"] = {"milestones": 8, "eval_tokens": 1024}
    d["resources"] = {"max_concurrent_trials": 1, "max_failures": 2}
    uri = mlflow_uri
    out = tmp_path / "out"
    before = set(pids_named("RayTrainWorker"))
    # the worker waits after its second milestone (index 1) while this file exists: the kill lands
    # mid-trial however fast the machine is (workloads/train/loop.py, fault-injection hook)
    hold = tmp_path / "hold"
    hold.touch()
    env = dict(
        ENV,
        CRITBATCH_TEST_MILESTONE_HOOKS=HOLD_HOOKS,
        CRITBATCH_TEST_HOLD_AT_MILESTONE="1",
        CRITBATCH_TEST_HOLD_FILE=str(hold),
    )
    log = open(tmp_path / "driver.log", "w")  # a file, not a pipe: nobody reads a pipe while we poll
    proc = subprocess.Popen(
        CLI
        + [
            "run",
            str(write_spec(tmp_path, d)),
            "--output",
            str(out),
            "--tracking-uri",
            uri,
            "--no-progress",
            "--address",
            ray_head.gcs_address,
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def diagnose():
        return (tmp_path / "driver.log").read_text()[-3000:]

    try:
        wait_for(lambda: len(result_rows(out)) >= 2, 600, "two milestone reports", diagnose=diagnose)
        workers = wait_for(lambda: [p for p in pids_named("RayTrainWorker") if p not in before], 60, "the Train worker")
        assert len(result_rows(out)) == 2  # held: the trial is mid-way when the worker dies
        os.kill(workers[0], signal.SIGKILL)
        hold.unlink()
        proc.wait(timeout=900)
    finally:
        proc.kill()
    assert proc.returncode == 0, diagnose()
    c, parents, kids = children(uri, "fault-worker")
    assert len(parents) == 1 and len(kids) == 1
    kid = kids[0]
    assert kid.info.status == "FINISHED" and kid.data.tags["critbatch.status"] == "COMPLETED"
    steps = [m.step for m in c.get_metric_history(kid.info.run_id, "val_loss")]
    assert sorted(steps) == [2048 * i for i in range(1, 9)]  # every milestone once: monotone, no duplicates
    rows = result_rows(out)
    assert rows[-1]["done"] and rows[-1]["tokens_seen"] == 16384


def test_killed_driver_then_resume_has_exactly_the_planned_trials(tmp_path, ray_head, mlflow_uri):
    """SIGKILL the sweep driver (on an external Ray cluster: the suite's; Ray ends a dead driver's job and its
    actors) mid-sweep, then `critbatch resume`."""
    address = ray_head.gcs_address
    d = spec_dict(name="fault-driver")
    d["search"].update(batch_sizes_sequences=[4, 8], trials_per_batch_size=2)
    d["resources"] = {
        "max_concurrent_trials": 1
    }  # one trial runner: two starting at once on 2 cores cost ~7 s a sweep (docs/benchmarks.md, the suite)
    uri = mlflow_uri
    out = tmp_path / "out"
    spec = write_spec(tmp_path, d)
    log = open(tmp_path / "driver.log", "w")
    proc = subprocess.Popen(
        CLI + ["run", str(spec), "--output", str(out), "--tracking-uri", uri, "--no-progress", "--address", address],
        cwd=ROOT,
        env=ENV,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(
            lambda: sum(1 for r in result_rows(out) if r.get("done")) >= 1 and len(result_rows(out)) >= 6,
            900,
            "one finished trial and another under way",
            diagnose=lambda: (tmp_path / "driver.log").read_text()[-3000:],
        )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    r = subprocess.run(
        CLI + ["resume", str(out), "--address", address, "--no-progress"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    cbs = json.loads((out / "cbs.json").read_text())
    assert cbs["trials"]["COMPLETED"] == 4
    trials = json.loads((out / "trials.json").read_text())
    assert len(trials) == 4 and len({t["trial_id"] for t in trials}) == 4
    assert sorted(t["batch_size_sequences"] for t in trials) == [4, 4, 8, 8]
    c, parents, kids = children(uri, "fault-driver")
    assert len(parents) == 1 and parents[0].data.tags["critbatch.status"] == "SUCCEEDED"
    assert len(kids) == 4
    assert sorted(k.data.tags["critbatch.trial_id"] for k in kids) == sorted(t["trial_id"] for t in trials)
    for k in kids:
        assert k.info.status == "FINISHED"
        steps = [m.step for m in c.get_metric_history(k.info.run_id, "val_loss")]
        assert sorted(steps) == [2048, 4096, 6144, 8192]
    # Every trial finished; one that finished within Tune's snapshot interval before the kill
    # (TUNE_GLOBAL_CHECKPOINT_S) is restarted from its last milestone checkpoint and must then
    # reproduce its final report exactly (deterministic resume), never a different result.
    final: dict[str, set] = {}
    for r in result_rows(out):
        if r.get("done"):
            final.setdefault(r["trial_id"], set()).add((r["tokens_seen"], r["val_loss"]))
    assert len(final) == 4
    assert all(len(v) == 1 for v in final.values()), final


def test_mlflow_outage_mid_trial_loses_nothing(tmp_path, ray_head, mlflow_template):
    """Stop the MLflow server after a trial's first metrics, start it again later: the run is complete
    (the sweep on the suite's Ray head)."""
    port = free_port()
    db = tmp_path / "mlflow.db"
    copy_mlflow_store(mlflow_template, db)
    arts = tmp_path / "artifacts"

    def start_server():
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                f"sqlite:///{db}",
                "--serve-artifacts",
                "--artifacts-destination",
                str(arts),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            env=ENV,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def up():
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    server = start_server()
    uri = f"http://127.0.0.1:{port}"
    out = tmp_path / "out"
    try:
        wait_for(up, 300, "the MLflow server")
        d = spec_dict(name="fault-mlflow", budget_tokens=16384)
        d["search"].update(batch_sizes_sequences=[8], lr_rules=["sqrt"], lr_multiplier=[1, 1], beta2={"values": [0.99]})
        d["eval"] = {"milestones": 8, "eval_tokens": 1024}
        d["resources"] = {"max_concurrent_trials": 1}
        log = open(tmp_path / "driver.log", "w")
        proc = subprocess.Popen(
            CLI
            + [
                "run",
                str(write_spec(tmp_path, d)),
                "--output",
                str(out),
                "--tracking-uri",
                uri,
                "--no-progress",
                "--address",
                ray_head.gcs_address,
            ],
            cwd=ROOT,
            env=ENV,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            wait_for(
                lambda: len(result_rows(out)) >= 1,
                600,
                "the first milestone",
                diagnose=lambda: (tmp_path / "driver.log").read_text()[-3000:],
            )
            os.killpg(server.pid, signal.SIGKILL)  # the server dies at once, as in a crash
            server.wait(timeout=60)
            wait_for(lambda: not up(), 60, "the MLflow server to be gone")
            wait_for(lambda: len(result_rows(out)) >= 4, 600, "three milestones during the outage")
            server = start_server()
            wait_for(up, 300, "the MLflow server again")
            proc.wait(timeout=900)
        finally:
            proc.kill()
        assert proc.returncode == 0, (tmp_path / "driver.log").read_text()[-5000:]
        c, parents, kids = children(uri, "fault-mlflow")
        assert len(parents) == 1 and parents[0].data.tags["critbatch.status"] == "SUCCEEDED"
        assert len(kids) == 1 and kids[0].info.status == "FINISHED"
        steps = sorted(m.step for m in c.get_metric_history(kids[0].info.run_id, "val_loss"))
        assert steps == [2048 * i for i in range(1, 9)]
        state = json.loads((out / "sweep.json").read_text())
        assert state["mlflow_complete"] is True
    finally:
        stop_group(server)


def test_killed_driver_while_trials_wait_at_a_rung_then_resume(tmp_path, ray_head, mlflow_uri):
    """Mode "pause": SIGKILL the driver while trials wait paused at a rung, then `critbatch resume`.

    The scheduler replays every rung from the trials' reports (and pruned_while_paused.json): the rungs
    decided before the kill are decided again alike, a trial that waited at a rung stays paused (Tune
    would restart it past the rung) until its batch size completes the rung, and each batch size still
    ends with one survivor.

    On the suite's Ray head: Ray ends the killed driver's job and its actors.
    """
    address = ray_head.gcs_address
    d = spec_dict(name="fault-pause")
    d["eval"] = {"milestones": 8, "eval_tokens": 1024}
    # one batch size of 3 trials, 2 at a time: two wait paused at the first rung while the third runs
    # (a second batch size would replay the same rungs independently: minutes, nothing more shown)
    d["search"].update(batch_sizes_sequences=[4], trials_per_batch_size=3, lr_multiplier=[0.25, 4.0])
    d["resources"] = {"max_concurrent_trials": 2}
    d["pruning"] = {"enabled": True, "mode": "pause"}
    uri = mlflow_uri
    out = tmp_path / "out"
    spec = write_spec(tmp_path, d)
    log = open(tmp_path / "driver.log", "w")
    # every trial waits after its third milestone (past the first rung) while this file exists, also one
    # resumed after a pause: no trial can finish before the kill, however fast trials start (workloads/testing/faults.py)
    hold = tmp_path / "hold"
    hold.touch()
    env = dict(
        ENV,
        CRITBATCH_TEST_MILESTONE_HOOKS=HOLD_HOOKS,
        CRITBATCH_TEST_HOLD_AT_MILESTONE="2",
        CRITBATCH_TEST_HOLD_FILE=str(hold),
        CRITBATCH_TEST_HOLD_EVERY_ATTEMPT="1",
    )
    proc = subprocess.Popen(
        CLI + ["run", str(spec), "--output", str(out), "--tracking-uri", uri, "--no-progress", "--address", address],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def at_rung() -> int:  # trials that reported the first rung's milestone (25 % = 2048 tokens)
        return len({r["trial_id"] for r in result_rows(out) if r.get("tokens_seen", 0) >= 2048})

    try:
        wait_for(
            lambda: at_rung() >= 2,
            400,
            "two trials at the first rung",
            diagnose=lambda: (tmp_path / "driver.log").read_text()[-3000:],
        )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        hold.unlink(missing_ok=True)
    # killed with no trial trained to its end (Tune's `done` also marks a trial pruned at the first rung)
    assert all(r["tokens_seen"] < d["budget_tokens"] for r in result_rows(out) if "tokens_seen" in r)
    r = subprocess.run(
        CLI + ["resume", str(out), "--address", address, "--no-progress"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    trials = json.loads((out / "trials.json").read_text())
    assert len(trials) == 3 and len({t["trial_id"] for t in trials}) == 3
    for b in (4,):  # LRs within 4x of the base: no trial diverges, the batch size keeps one of three
        statuses = sorted(t["status"] for t in trials if t["batch_size_sequences"] == b)
        assert statuses == ["COMPLETED", "PRUNED", "PRUNED"], statuses
    for t in trials:
        # continuous curves (a restart resumes from the last milestone), and no trial trained past the rung
        # it was pruned at (rungs at 25 % and 50 %: milestones 2048 and 4096): a trial that waited at a rung
        # when the driver died was held paused on resume, not restarted
        assert t["tokens"] == [1024.0 * (i + 1) for i in range(len(t["tokens"]))], t
        if t["status"] == "PRUNED":
            assert t["tokens"][-1] == 2048.0 * (t["pruning"]["pruned_rung"] + 1), t
        if t["status"] == "COMPLETED":  # its decisions, taken before and after the kill, are all on record
            assert [d.split(":")[0].split("@")[0] for d in t["pruning"]["rung_decisions"].split(";")] == ["r0", "r1"], t
    c, parents, kids = children(uri, "fault-pause")
    assert len(parents) == 1 and parents[0].data.tags["critbatch.status"] == "SUCCEEDED"
    by_id = {t["trial_id"]: t for t in trials}
    assert sorted(k.data.tags["critbatch.trial_id"] for k in kids) == sorted(by_id)
    for k in kids:
        assert k.data.tags["critbatch.status"] == by_id[k.data.tags["critbatch.trial_id"]]["status"]
