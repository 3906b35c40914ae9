"""CPU training reproducible to the last digit (workloads/train/determinism.py): the settings a worker applies, and
that turning torch's deterministic algorithms on leaves the loop's numbers exactly as they were (so the
documented results, computed before it was on, stand). Each check runs in its own Python process: the
settings are process-wide."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT

_CHILD = r"""
import json, os, sys, warnings
import torch
from tests.workloads.train.test_loop import cfg
from workloads.train.determinism import make_deterministic
from workloads.pretrain import run_pretrain

def losses():
    rows = []
    trial = cfg(model={"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 128, "context_length_tokens": 64},
                budget_tokens=8192, eval={"milestones_tokens": (4096, 8192)}, schedule={"warmup_tokens": 1024})
    run_pretrain(trial, device=torch.device("cpu"), report=lambda m, s: rows.append(m))
    return [(r["val_loss"], r["train_loss"]) for r in rows]

train = sys.argv[2] == "train"
torch.set_num_threads(1)
before = {"deterministic": torch.are_deterministic_algorithms_enabled()}
plain = losses() if train else None
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    settings = make_deterministic(torch.device("cpu"), int(sys.argv[1]))
    det = losses() if train else None
print(json.dumps({"before": before, "settings": settings, "plain": plain, "det": det,
                  "warnings": [str(w.message)[:200] for w in caught]}))
"""


def _child(threads: int, env_threads: str | None = None, train: bool = True) -> dict:
    import os

    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if env_threads is not None:
        env["OMP_NUM_THREADS"] = env_threads
    r = subprocess.run(
        [sys.executable, "-c", _CHILD, str(threads), "train" if train else "settings"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_deterministic_algorithms_leave_the_cpu_loop_s_numbers_unchanged_to_the_last_digit():
    out = _child(1)
    assert out["before"] == {"deterministic": False}
    assert out["settings"] == {
        "torch_num_threads": 1,
        "omp_num_threads": None,
        "deterministic_algorithms": True,
        "deterministic_warn_only": True,
    }
    assert out["det"] == out["plain"]  # floats through JSON: equal to the last digit
    assert len(out["det"]) == 2 and all(v == v for row in out["det"] for v in row)
    assert not [w for w in out["warnings"] if "deterministic" in w.lower()]  # no op fell back to a warning


def test_the_thread_count_is_the_one_asked_for_whatever_omp_num_threads_says():
    out = _child(2, env_threads="1", train=False)
    assert out["settings"]["torch_num_threads"] == 2 and out["settings"]["omp_num_threads"] == "1"
