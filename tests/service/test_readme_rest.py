"""README's REST example, run as written, against the test cluster and MLflow server.

The lines of step 4 of "On a Ray cluster" run in bash from the clone, up to the POST, with two
substitutions: a free port instead of 8000, and the example spec cut to one trial (same file
otherwise: its data path is relative to the clone, so the corpus must travel with the job through
``CRITBATCH_DATA_DIR``). Steps 1-2 are the session's Ray head and MLflow server (RAY_ADDRESS,
MLFLOW_TRACKING_URI). The sweep must start training (its data shipped), not fail on
"data.path: file not found"; it is then stopped with ``DELETE`` and followed to STOPPED, with no
MLflow run of it left RUNNING.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from harness import free_port, wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = "sweeps/examples/shakespeare-char.yaml"
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
TIMEOUT_S = 300


def readme_rest_lines() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = text.split("## On a Ray cluster", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = block.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("# 4."))
    post = next(i for i, ln in enumerate(lines) if i > start and "-X POST" in ln)
    end = post
    while lines[end].rstrip().endswith("\\"):
        end += 1
    return lines[start : end + 1]


def one_trial_example(tmp_path: Path) -> Path:
    """The README's example spec with one batch size and one trial per batch size."""
    d = yaml.safe_load((REPO / EXAMPLE).read_text())
    assert not Path(d["data"]["path"]).is_absolute()  # what makes CRITBATCH_DATA_DIR matter
    # 1024 steps: still running when stopped; the base batch size is the one swept (search.strategy transfer
    # starts there), base_lr the example's 0.003 at 16 scaled by its sqrt rule, so the trial's LR is as before
    d["search"].update(
        batch_sizes_sequences=[4],
        trials_per_batch_size=1,
        base_batch_size_sequences=4,
        base_lr=d["search"]["base_lr"] * (4 / d["search"]["base_batch_size_sequences"]) ** 0.5,
    )
    p = tmp_path / "one-trial.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def test_readme_rest_example_runs_as_written(cluster_env, tmp_path):
    lines = readme_rest_lines()
    assert any("CRITBATCH_DATA_DIR" in ln for ln in lines), "README's example must say what the service ships"
    script = "\n".join(lines)
    assert f"@{EXAMPLE}" in script, "README's POST no longer sends the example spec"
    port = free_port()
    script = script.replace("8000", str(port)).replace(f"@{EXAMPLE}", f"@{one_trial_example(tmp_path)}")
    script += '\necho\necho "TOKEN=$CRITBATCH_API_TOKEN"\nwait\n'
    out = tmp_path / "readme.out"
    with open(out, "w") as fh:
        proc = subprocess.Popen(
            ["bash", "-c", script],
            cwd=REPO,
            env=dict(cluster_env),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    sid = auth = url = None
    try:
        # the service starts and the POST answers (or the script ends early: its output says why)
        def posted():
            t = out.read_text()
            return t if "TOKEN=" in t or proc.poll() is not None else None

        text = wait_for(posted, 180, "the README's POST")
        m = re.search(r'\{"id":\s*"([^"]+)".*', text)
        assert m and "TOKEN=" in text, text[-3000:]
        created = m.group(0)
        assert '"status":"PENDING"' in created.replace(" ", ""), created
        sid = m.group(1)
        auth = {"Authorization": f"Bearer {text.split('TOKEN=', 1)[1].split()[0]}"}
        url = f"http://127.0.0.1:{port}"

        def status(until):
            """A poll: the sweep's status if ``until`` holds for it, else None."""
            b = httpx.get(f"{url}/v1/sweeps/{sid}", headers=auth, timeout=60).json()
            return b if until(b) else None

        body = wait_for(
            lambda: status(lambda b: b["status"] in TERMINAL or (b.get("trials") or {}).get("running")),
            TIMEOUT_S,
            f"{sid}: a running trial",
            interval_s=1.0,
        )
        logs = httpx.get(f"{url}/v1/sweeps/{sid}/logs", headers=auth, timeout=60).text
        assert body["status"] == "RUNNING" and body["trials"]["running"] == 1, (body, logs[-3000:])
        assert "file not found" not in logs

        # wait_s=0: the stop is sent and not waited for, so the documented answer is 202 (still stopping)
        r = httpx.delete(f"{url}/v1/sweeps/{sid}", headers=auth, params={"wait_s": 0}, timeout=120)
        assert r.status_code == 202, r.text
        assert r.json()["stop_sent"] is True and r.json()["status"] == "RUNNING", r.json()
        stopped = wait_for(
            lambda: status(lambda b: b["status"] in TERMINAL), TIMEOUT_S, f"{sid} to end after DELETE", interval_s=1.0
        )
        assert stopped["status"] == "STOPPED" and stopped["ray_status"] == "STOPPED", stopped
        assert stopped["trials"]["running"] == 0 and stopped["trials"]["stopped"] == 1, stopped
        assert stopped["mlflow_error"] is None and stopped["parent_run_id"], stopped
        from mlflow import MlflowClient

        c = MlflowClient(cluster_env["MLFLOW_TRACKING_URI"])
        runs = c.search_runs(
            [e.experiment_id for e in c.search_experiments()], filter_string=f"tags.`critbatch.sweep_id` = '{sid}'"
        )
        assert sorted(r.data.tags["critbatch.role"] for r in runs) == ["sweep", "trial"], runs
        assert [(r.info.status, r.data.tags["critbatch.status"]) for r in runs if r.info.status == "RUNNING"] == []
        # once ended, DELETE answers 200 with the final state and sends nothing
        again = httpx.delete(f"{url}/v1/sweeps/{sid}", headers=auth, timeout=120)
        assert again.status_code == 200 and again.json()["stop_sent"] is False and again.json()["status"] == "STOPPED"
    finally:
        if sid and auth:  # a failed test leaves no sweep running on the shared cluster
            try:
                httpx.delete(f"{url}/v1/sweeps/{sid}", headers=auth, params={"wait_s": 30}, timeout=90)
            except httpx.HTTPError:
                pass
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
