"""An independent check of ``cbs.json`` against ``trials.json``, shared by the
integration tests: written from the methodology's rule, not from ``sweeps.analysis``."""

from __future__ import annotations

import json
import math
from pathlib import Path


def first_crossing_tokens(tokens: list[float], losses: list, target: float, last_tokens: float) -> float | None:
    """Tokens at the first milestone at or below ``target`` (log-linear between milestones), unless
    that milestone is the batch size's last one."""
    for i, (t, v) in enumerate(zip(tokens, losses)):
        if v is None:
            return None
        if v <= target:
            if t >= last_tokens:
                return None
            if i == 0:
                return t
            t0, v0 = tokens[i - 1], losses[i - 1]
            return math.exp(math.log(t0) + (v0 - target) / (v0 - v) * (math.log(t) - math.log(t0)))
    return None


def assert_steps_are_minimum_over_trials(out: Path) -> int:
    """Every target's points in ``OUT/cbs.json`` are, per (batch size, seed), the minimum steps to
    target over that batch size's trials in ``OUT/trials.json``. Returns how many points were checked."""
    cbs = json.loads((out / "cbs.json").read_text())
    trials = json.loads((out / "trials.json").read_text())
    T = cbs["tokens_per_sequence"]
    last = {}
    for t in trials:
        if t["tokens"]:
            last[t["batch_size_sequences"]] = max(last.get(t["batch_size_sequences"], 0), max(t["tokens"]))
    checked = 0
    for entry in cbs["targets"]:
        want: dict[tuple[int, int], tuple[float, str]] = {}
        for t in trials:
            if not t["tokens"]:
                continue
            b = t["batch_size_sequences"]
            tok = first_crossing_tokens(t["tokens"], t["val_loss"], entry["target_loss"], last[b])
            if tok is not None and ((b, t["seed"]) not in want or tok < want[(b, t["seed"])][0]):
                want[(b, t["seed"])] = (tok, t["trial_id"])
        got = {(p["batch_size_sequences"], p["seed"]): p for p in entry["points"]}
        assert set(got) == set(want), (entry["target_loss"], sorted(got), sorted(want))
        for key, (tok, tid) in want.items():
            b = key[0]
            assert math.isclose(got[key]["steps_to_target"], tok / (b * T), rel_tol=1e-9), (entry["target_loss"], key)
            assert got[key]["trial_id"] == tid or math.isclose(got[key]["tokens_to_target"], tok, rel_tol=1e-12)
            checked += 1
    return checked


def assert_analyze_trials_reproduces_cbs_json(out: Path) -> None:
    """``critbatch analyze --trials OUT/trials.json`` prints exactly ``OUT/cbs.json`` (in this process:
    it starts no Ray, and a second interpreter cost a CLI start-up for nothing)."""
    from tests.conftest import invoke_cli

    r = invoke_cli(["analyze", "--trials", str(out / "trials.json")])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == json.loads((out / "cbs.json").read_text())
