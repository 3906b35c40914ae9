"""The training loop without Ray: batching, batch-size warmup, exact resume, divergence."""

import copy
import math

import pytest
import torch

from workloads.batching import batch_schedule_steps, plan_batch
from workloads.config import TrialConfig
from workloads.pretrain import build_pretrain, run_pretrain
from tests.conftest import ROOT

DATA = str(ROOT / "data" / "tinyshakespeare" / "input.txt")


def cfg(**kw) -> TrialConfig:
    base = dict(trial_id="t", data_path=DATA, d_model=32, n_layers=1, n_heads=2, d_ff=64, context_length_tokens=32,
                budget_tokens=4096, milestones_tokens=(1024, 2048, 3072, 4096), eval_tokens=1024, warmup_tokens=512,
                ema_half_life_tokens=1024, batch_size_sequences=8, lr=3e-3, beta2=0.99,
                beta2_half_life_tokens=8 * 32 * math.log(0.5) / math.log(0.99), micro_batch_size_sequences_max=64)
    base.update(kw)
    return TrialConfig(**base)


def run(c: TrialConfig, resume=None):
    reports = []
    torch.manual_seed(123)
    # the adapter serialises the state at once; keep a copy as it does
    out = run_pretrain(c, device=torch.device("cpu"), report=lambda m, s: reports.append((m, copy.deepcopy(s))),
                       resume_state=resume)
    return out, reports


@pytest.mark.parametrize("B,W,mx,kmin,expect", [
    (8, 1, 64, 1, (8, 1)),
    (8, 1, 64, 2, (4, 2)),
    (256, 1, 64, 2, (64, 4)),
    (256, 2, 64, 2, (64, 2)),
    (4, 2, 64, 2, (2, 1)),
    (12, 1, 5, 1, (4, 3)),
])
def test_plan_batch(B, W, mx, kmin, expect):
    p = plan_batch(B, W, mx, kmin)
    assert (p.micro_batch_size_sequences, p.grad_accum_steps) == expect
    assert p.micro_batch_size_sequences * p.grad_accum_steps * p.workers == B


def test_plan_batch_rejects_indivisible():
    with pytest.raises(ValueError, match="divisible"):
        plan_batch(6, 4, 64)


def test_batch_warmup_takes_the_exact_number_of_steps():
    # 4096 tokens, T = 32; batch 4 (128 tok/step) until 1024 tokens, 8 until 2048, then 16 (512 tok/step)
    phases = batch_schedule_steps(4096, 32, 16, [(0, 1), (1024, 2), (2048, 4)])
    assert phases == [(4, 8), (8, 4), (16, 4)]
    out, reports = run(cfg(batch_size_sequences=16, batch_warmup=((0, 1), (1024, 2), (2048, 4)),
                           beta2_half_life_tokens=4096.0))
    assert out.status == "completed"
    final = reports[-1][0]
    assert final["step"] == 8 + 4 + 4 and final["tokens_seen"] == 4096
    # steps saved against the initial batch (4 sequences): 4096 / 128 - 16 = 16
    assert final["steps_saved_vs_initial_batch"] == 32 - 16
    assert final["batch_size_sequences_now"] == 16


def test_reports_at_milestones_only_with_monotone_tokens():
    out, reports = run(cfg())
    toks = [m["tokens_seen"] for m, _ in reports]
    assert toks == [1024, 2048, 3072, 4096]
    m = reports[-1][0]
    assert m["done"] and m["status"] == "completed"
    assert m["flops"] == pytest.approx(build_pretrain(cfg(), torch.device("cpu")).flops_per_token * 4096)
    assert m["b_simple"] is not None and m["b_simple"] > 0
    assert m["val_loss"] < math.log(256)
    assert m["mfu"] is None  # CPU: no MFU, never a guess


def test_resume_from_checkpoint_is_exact():
    full_out, full = run(cfg())
    states = [s for _, s in full]
    # resume from the state saved with the second report
    resumed_out, resumed = run(cfg(), resume=states[1])
    assert [m["tokens_seen"] for m, _ in resumed] == [3072, 4096]
    for (a, _), (b, _) in zip(full[2:], resumed):
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-5)
        assert b["b_simple"] == pytest.approx(a["b_simple"], rel=1e-5)


def test_divergence_is_a_named_outcome():
    out, reports = run(cfg(lr=50.0, warmup_tokens=0, grad_clip_norm=None))
    assert out.status == "diverged"
    last = reports[-1][0]
    assert last["status"] == "diverged" and last["done"]
    assert last["objective"] == pytest.approx(math.log(256))
    assert last["tokens_seen"] < 4096 or math.isnan(last["val_loss"]) or last["val_loss"] > 1.5 * math.log(256)


def test_wsd_schedule_runs_decay_branches_and_counts_their_flops():
    out, reports = run(cfg(schedule_kind="wsd", decay_fraction=0.25))
    assert out.status == "completed"
    m = reports[-1][0]
    assert m["flops_measurement"] > 0
    assert m["val_loss_raw"] is not None


def test_noise_scale_needs_two_micro_batches_for_tiny_batches():
    out, reports = run(cfg(batch_size_sequences=2, beta2_half_life_tokens=2048.0))
    assert reports[-1][0]["b_simple"] is not None
