"""A sweep started and stopped (Ctrl-C) on an older revision, resumed on this checkout (a sweep
started before a restructuring must still resume after it).

    git worktree add /tmp/wt-old <old revision>
    .venv/bin/python scripts/resume_across_revisions.py /tmp/wt-old [/tmp/xrev [KEEP]]

The old revision runs from its worktree (``PYTHONPATH``), with this checkout's ``.venv``: a tiny sweep of
2 batch sizes x 1 trial, 8 milestones, one trial at a time, held after its second milestone
(``CRITBATCH_TEST_HOLD_*``) and stopped with SIGINT; then ``critbatch resume`` on this checkout. Prints
the old run's exit code and status, the resume's exit code, each trial's status and milestones, and the
final status (expected: 130 STOPPED, 0, two COMPLETED trials of 8 milestones, SUCCEEDED). With KEEP, the
stopped sweep's ``tuner.pkl`` and ``searcher-state.pkl`` are copied there before the resume.
"""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

NEW = str(Path(__file__).resolve().parents[1])
OLD, PY = str(Path(sys.argv[1]).resolve()), str(Path(NEW) / ".venv" / "bin" / "python")
W = Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/xrev")
W.mkdir(parents=True, exist_ok=True)
out = W / "out"
shutil.rmtree(out, ignore_errors=True)
for f in W.glob("ml.db*"):
    f.unlink()
d = yaml.safe_load(open(f"{NEW}/tests/specs/tiny.yaml"))
d["name"] = "xrev"
d["data"]["path"] = f"{NEW}/data/tinyshakespeare/input.txt"
d["eval"] = {"milestones": 8, "eval_tokens": 1024}
d["search"]["batch_sizes_sequences"] = [4, 8]
d["resources"] = {"max_concurrent_trials": 1}
(W / "spec.yaml").write_text(yaml.safe_dump(d))
hold = W / "hold"
hold.touch()
OLD_CLI = (
    "critbatch" if Path(OLD, "critbatch", "__main__.py").is_file() else "sweeps.cli"
)  # before the critbatch package: sweeps.cli
env = dict(
    os.environ,
    RAY_AUTH_MODE="disabled",
    RAY_USAGE_STATS_ENABLED="0",
    PYTHONPATH=OLD,
    CRITBATCH_TEST_MILESTONE_HOOKS="workloads.testing.faults:hold_from_env",
    CRITBATCH_TEST_HOLD_AT_MILESTONE="1",
    CRITBATCH_TEST_HOLD_FILE=str(hold),
)
log = open(W / "old.log", "w")
p = subprocess.Popen(
    [
        PY,
        "-m",
        OLD_CLI,
        "run",
        str(W / "spec.yaml"),
        "--output",
        str(out),
        "--tracking-uri",
        f"sqlite:///{W}/ml.db",
        "--no-progress",
    ],
    cwd=OLD,
    env=env,
    stdout=log,
    stderr=subprocess.STDOUT,
    start_new_session=True,
)


def rows():
    r = []
    for f in glob.glob(f"{out}/tune/**/result.json", recursive=True):
        r += [json.loads(x) for x in open(f) if x.strip()]
    return r


t0 = time.time()
while not any(x.get("tokens_seen", 0) >= 2048 for x in rows()):
    assert p.poll() is None and time.time() - t0 < 300, (W / "old.log").read_text()[-3000:]
    time.sleep(0.5)
os.killpg(p.pid, signal.SIGINT)
rc = p.wait(timeout=300)
hold.unlink()
print("old run exit", rc, json.loads((out / "sweep.json").read_text())["status"])
if (
    len(sys.argv) > 3
):  # keep the old revision's Tune state (tests/sweeps/run/data/ holds one) before the resume rewrites it
    keep = Path(sys.argv[3])
    keep.mkdir(parents=True, exist_ok=True)
    for f in [*glob.glob(f"{out}/tune/*/tuner.pkl"), *glob.glob(f"{out}/tune/*/searcher-state-*.pkl")]:
        shutil.copy(f, keep / ("tuner.pkl" if f.endswith("tuner.pkl") else "searcher-state.pkl"))
env2 = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
r = subprocess.run(
    [PY, "-m", "critbatch", "resume", str(out), "--no-progress"],
    cwd=NEW,
    env=env2,
    capture_output=True,
    text=True,
    timeout=600,
)
print("new resume exit", r.returncode, r.stderr[-1500:] if r.returncode else "")
trials = json.loads((out / "trials.json").read_text())
print([(t["status"], len(t["tokens"]), t["tokens"][-1]) for t in trials])
print("sweep.json", json.loads((out / "sweep.json").read_text())["status"])
