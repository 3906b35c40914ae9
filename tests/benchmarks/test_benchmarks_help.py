"""Every benchmark answers ``--help`` (exit 0, its usage) from the repo root, quickly, without starting anything:
each parses its arguments before it imports the training stack or starts Ray. ``runner_memory.py`` had no
argument parser and started a Ray head and a sweep on ``--help``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import ROOT

BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))
#: generous for a loaded 2-core CI machine; an idle one answers each in about a second
TIMEOUT_S = 90


def test_there_are_benchmarks_to_check():
    assert len(BENCHMARKS) >= 10 and (ROOT / "benchmarks" / "search_efficiency.py") in BENCHMARKS


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_a_benchmark_answers_help_and_exits_0(path):
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", RAY_ADDRESS="127.0.0.1:9")
    # its own process group: one that ignored --help and started processes is stopped whole
    proc = subprocess.Popen(
        [sys.executable, str(path.relative_to(ROOT)), "--help"],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{path.name} --help did not answer in {TIMEOUT_S} s:\n{out[-2000:]}\n{err[-2000:]}")
    assert proc.returncode == 0, out[-2000:] + err[-4000:]
    assert out.startswith(f"usage: {path.name} "), out[:500]
