"""A trial on a two-node Ray cluster (both nodes on this machine): its 2 Train workers on different
nodes, data memory-mapped from prepared shards, checkpoints through ``resources.storage_path``; a
worker killed mid-trial, the trial resumed from its checkpoint and finished.

Each node has 1 CPU and a worker needs 0.75, so two workers cannot share a node (the trial's Tune
driver, 0.25 CPU, fits beside one of them). The sweep runs two identical trials one after the other
(same configuration and seed); the first is killed after its second of four milestones, the second
runs clean, so "the resumed losses continue from the checkpoint" is tested as: the killed trial's
curve equals the uninterrupted one's at every milestone, and the two milestones before the kill
reached Tune again only as the checkpoint's replays (the restarted group did not retrain them).
See docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, write_spec
from tests.sweeps.run.test_faults import CLI, ENV, RAY, children, free_port, pids_named, spec_dict, stop_group, wait_for
from workloads.data.prepare import prepare_data
from workloads.testing.faults import HOLD_HOOKS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(720)]  # ~4 min idle (two nodes up, a sweep, a kill)


def _start_node(env: dict, log: Path, *, head_port: int | None = None, port: int | None = None) -> subprocess.Popen:
    """``ray start --block`` with 1 CPU in its own process group: the head (``port``) or a node joining
    ``head_port``; every port it opens outside 10002-19999 (see ``test_faults.start_ray_head``)."""
    workers = 20000 + 1000 * random.randrange(10)
    role = (
        [
            "--head",
            f"--port={port}",
            "--include-dashboard=false",
            f"--dashboard-port={free_port()}",
            f"--ray-client-server-port={free_port()}",
            f"--temp-dir={tempfile.mkdtemp(prefix='cbn', dir='/tmp')}",
        ]
        if head_port is None
        else [f"--address=127.0.0.1:{head_port}"]
    )
    cmd = [
        RAY,
        "start",
        "--block",
        "--num-cpus=1",
        *role,
        f"--min-worker-port={workers}",
        f"--max-worker-port={workers + 999}",
        f"--node-manager-port={free_port()}",
        f"--object-manager-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--metrics-export-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
        "--disable-usage-stats",
    ]
    # a loaded machine starts the raylet's dashboard agent slowly: the raylet waits for its port file
    # this long (seen: it gave up after 18 s at load average 16, and the node never came up)
    env = {"RAY_agent_register_timeout_ms": "120000", **env}
    return subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def _started(log: Path) -> bool:
    return "Ray runtime started" in log.read_text(errors="replace")


def _start_until_up(env: dict, log: Path, what: str, **where) -> subprocess.Popen:
    """:func:`_start_node`, again (three tries) when it exits before it is up: on a loaded machine a node
    can time out during startup ("The current node timed out during startup"), as ``ray.init`` does."""
    for attempt in range(3):
        node = _start_node(env, log, **where)
        up = wait_for(
            lambda: _started(log) or node.poll() is not None,
            180,
            what,
            diagnose=lambda: log.read_text(errors="replace")[-2000:],
        )
        if up and node.poll() is None:
            return node
        stop_group(node, first=signal.SIGKILL)
    raise AssertionError(f"{what} did not start three times:\n{log.read_text(errors='replace')[-2000:]}")


def _train_workers_of(node: subprocess.Popen) -> list[int]:
    """The ``ray::RayTrainWorker`` processes under ``node``'s ``ray start`` (its raylet's children), so
    another cluster's workers on this machine are never touched."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    mine = {node.pid}
    for _ in range(4):  # ray start -> raylet -> worker (-> forks)
        mine |= {pid for pid, pp in parent.items() if pp in mine}
    return sorted(p for p in pids_named("RayTrainWorker") if p in mine)


def _stop_all(nodes: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    """SIGKILL to every node's process group at once (a graceful ``ray start --block`` stop took 30 s
    and more; these nodes are thrown away), then wait up to ``grace_s`` for them to go."""
    for sig in (signal.SIGKILL,):
        for n in nodes:
            try:
                os.killpg(n.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(n.poll() is None for n in nodes):
            time.sleep(0.2)
    for n in nodes:
        n.wait(timeout=30)


def _report_rows(out: Path) -> dict[str, list[dict]]:
    """Every report Tune received, per trial, in order (``OUT/reports/<trial id>.jsonl``)."""
    return {
        f.stem: [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        for f in sorted((out / "reports").glob("*.jsonl"))
    }


def _worker_fields(row: dict) -> dict:
    """What the workers reported (Tune adds its own bookkeeping: times, iteration counts, paths)."""
    keys = (
        "tokens_seen",
        "step",
        "val_loss",
        "val_loss_raw",
        "train_loss",
        "tokens_per_s",
        "b_simple",
        "grad_norm",
        "flops_measurement",
        "worker_nodes",
    )
    return {k: row.get(k) for k in keys}


def test_two_workers_on_two_nodes_a_killed_worker_resumes_from_the_checkpoint(tmp_path, mlflow_uri):
    shards = tmp_path / "shards"
    prepare_data([str(ROOT / "data" / "tinyshakespeare" / "input.txt")], shards, text_documents="paragraph", num_proc=1)
    storage = tmp_path / "storage"  # what a shared filesystem is to a real cluster: both nodes see it
    hold = tmp_path / "hold"
    hold.touch()
    # the trial processes run under the nodes' environment: the hold plan (workloads/testing/faults.py) goes there
    env = dict(
        ENV,
        CRITBATCH_TEST_MILESTONE_HOOKS=HOLD_HOOKS,
        CRITBATCH_TEST_HOLD_AT_MILESTONE="1",
        CRITBATCH_TEST_HOLD_FILE=str(hold),
    )
    port = free_port()
    nodes = [_start_until_up(env, tmp_path / "head.log", "the Ray head", port=port)]
    try:
        nodes.append(_start_until_up(env, tmp_path / "node.log", "the second node", head_port=port))
        d = spec_dict(name="two-nodes")
        d["data"] = {"shards": str(shards), "tokenizer": "byte"}
        # two twins: independent studies with nothing to sample give both trials the same configuration
        # (transfer, the default, would place them half an octave apart)
        d["search"].update(
            batch_sizes_sequences=[8],
            lr_rules=["sqrt"],
            lr_multiplier=[1, 1],
            beta2={"values": [0.99]},
            trials_per_batch_size=2,
            strategy="independent",
        )
        d["resources"] = {
            "workers_per_trial": 2,
            "cpus_per_worker": 0.75,
            "trial_driver_cpus": 0.25,
            "max_concurrent_trials": 1,
            "max_failures": 2,
            "storage_path": str(storage),
        }
        uri = mlflow_uri
        out = tmp_path / "out"
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
                f"127.0.0.1:{port}",
            ],
            cwd=ROOT,
            env=ENV,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )

        def diagnose():
            return (tmp_path / "driver.log").read_text()[-3000:]

        try:
            rows = wait_for(
                lambda: [r for r in _report_rows(out).values() if len(r) >= 2],
                300,
                "two milestone reports",
                diagnose=diagnose,
            )
            per_node = wait_for(
                lambda: (lambda w: w if all(len(x) == 1 for x in w) else None)([_train_workers_of(n) for n in nodes]),
                60,
                "one Train worker under each node",
            )
            assert len(rows) == 1 and len(rows[0]) == 2  # held after milestone 1: the trial is mid-way
            killed_at = time.time()
            os.kill(per_node[1][0], signal.SIGKILL)  # the worker on the second node
            hold.unlink()
            proc.wait(timeout=600)
        finally:
            proc.kill()
        assert proc.returncode == 0, diagnose()
        reports = _report_rows(out)
        sweep_id = json.loads((out / "sweep.json").read_text())["sweep_id"]
    finally:
        _stop_all(nodes)

    assert len(reports) == 2
    killed = next(t for t, r in reports.items() if len(r) > 4)
    clean = next(t for t in reports if t != killed)
    k, c = reports[killed], reports[clean]
    # placement: every worker group of both trials had its two workers on two different nodes
    for row in k + c:
        ids = row["worker_nodes"].split(",")
        assert len(ids) == 2 and ids[0] != ids[1], row["worker_nodes"]
    # the restarted group first sent the checkpoint's two reports again, unchanged (they were not
    # retrained: a retrained row has its own tokens_per_s), then trained the last two milestones
    assert [r["tokens_seen"] for r in k] == [2048, 4096, 2048, 4096, 6144, 8192]
    assert [_worker_fields(r) for r in k[2:4]] == [_worker_fields(r) for r in k[0:2]]
    assert [r["tokens_seen"] for r in c] == [2048, 4096, 6144, 8192] and c[-1]["done"] and k[-1]["done"]
    # the resumed losses continue from the checkpoint: the uninterrupted twin's curve, milestone by milestone
    for a, b in zip(k[:2] + k[4:], c):
        assert a["step"] == b["step"] and a["tokens_seen"] == b["tokens_seen"]
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5), (a["tokens_seen"], a["val_loss"], b["val_loss"])
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
    # the checkpoint the restart read lies on the shared storage path (the last one is kept)
    folder = (
        storage / sweep_id / "train" / f"train-{killed}"
    )  # a runner's ckpt-<n> (Ray Train's checkpoint_<time> without)
    ckpts = [*folder.glob("ckpt-*/trial_state.pt"), *folder.glob("checkpoint_*/trial_state.pt")]
    assert ckpts, sorted(str(p.relative_to(storage)) for p in storage.rglob("*"))[:40]
    assert min(p.stat().st_mtime for p in ckpts) > killed_at  # written after the restart: it trained on
    # one MLflow child per trial, every milestone once on a monotone tokens axis
    client, parents, kids = children(uri, "two-nodes")
    assert len(parents) == 1 and parents[0].data.tags["critbatch.status"] == "SUCCEEDED" and len(kids) == 2
    for kid in kids:
        assert kid.data.tags["critbatch.status"] == "COMPLETED"
        assert [
            m.step for m in sorted(client.get_metric_history(kid.info.run_id, "val_loss"), key=lambda m: m.step)
        ] == [2048, 4096, 6144, 8192]
