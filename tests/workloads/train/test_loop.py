"""The training loop without Ray: batching, batch-size warmup, LR warmup, exact resume, divergence,
and a step's token-weighted gradient for every split of the global batch (real 2-process gloo group)."""

import copy
import json
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from tests.conftest import ROOT
from tests.workloads.ranks import leave_group_and_exit
from tests.workloads.trial import with_sections
from workloads.config import (
    BatchConfig,
    DataConfig,
    EvalConfig,
    FinetuneConfig,
    ModelConfig,
    OptimizerConfig,
    ScheduleConfig,
    TrialConfig,
    WorkloadConfig,
)
from workloads.pretrain import build_pretrain, run_pretrain
from workloads.testing.faults import FaultPlan
from workloads.train.batching import batch_schedule_steps, plan_batch
from workloads.train.scaling import warmup_factor, warmup_length_tokens
from workloads.train.step import IGNORE_INDEX, step_gradient

DATA = str(ROOT / "data" / "tinyshakespeare" / "input.txt")
BASE = TrialConfig(
    trial_id="t",
    workload=WorkloadConfig(
        model=ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, context_length_tokens=32),
        data=DataConfig(path=DATA),
    ),
    budget_tokens=4096,
    optimizer=OptimizerConfig(lr=3e-3, beta2=0.99, beta2_half_life_tokens=8 * 32 * math.log(0.5) / math.log(0.99)),
    schedule=ScheduleConfig(warmup_tokens=512, ema_half_life_tokens=1024),
    batch=BatchConfig(batch_size_sequences=8, micro_batch_size_sequences_max=64),
    eval=EvalConfig(milestones_tokens=(1024, 2048, 3072, 4096), eval_tokens=1024),
)


def cfg(**changes) -> TrialConfig:
    """The tiny pretraining trial, with sections changed (:func:`tests.workloads.trial.with_sections`)."""
    return with_sections(BASE, **changes)


def spy_noise_norms(monkeypatch) -> list[tuple[float, float, int, int]]:
    """Record the ``(mean small-batch |g|^2, big-batch |g|^2, b_small, K)`` of every step (training and WSD
    branch steps alike) as the stepper hands them to the noise-scale estimator."""
    import workloads.train.step

    seen: list[tuple[float, float, int, int]] = []
    real = workloads.train.step.step_estimates

    def spy(small, big, b, k):
        seen.append((small, big, b, k))
        return real(small, big, b, k)

    monkeypatch.setattr(workloads.train.step, "step_estimates", spy)
    return seen


def expected_b_simple(norms, decay: float) -> float:
    """``B_simple`` after these steps, computed here: McCandlish et al. 2018, Eq. A.2, with B_small = b and
    B_big = b K per step, then the ratio of the EMAs (decay ``decay``; their bias corrections cancel)."""
    g2, tr = [], []
    for small, big, b, k in norms:
        b_small, b_big = b, b * k
        g2.append((b_big * big - b_small * small) / (b_big - b_small))
        tr.append((small - big) / (1 / b_small - 1 / b_big))
    w = [decay ** (len(norms) - 1 - i) for i in range(len(norms))]
    return sum(wi * t for wi, t in zip(w, tr)) / sum(wi * g for wi, g in zip(w, g2))


def run(c: TrialConfig, resume=None, on_milestone=()):
    reports = []
    torch.manual_seed(123)
    # the adapter serialises the state at once; keep a copy as it does
    out = run_pretrain(
        c,
        device=torch.device("cpu"),
        report=lambda m, s: reports.append((m, copy.deepcopy(s))),
        resume_state=resume,
        on_milestone=on_milestone,
    )
    return out, reports


@pytest.mark.parametrize(
    "B,W,mx,kmin,expect",
    [
        (8, 1, 64, 1, (8, 1)),
        (8, 1, 64, 2, (4, 2)),
        (256, 1, 64, 2, (64, 4)),
        (256, 2, 64, 2, (64, 2)),
        (4, 2, 64, 2, (2, 1)),
        (12, 1, 5, 1, (4, 3)),
    ],
)
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
    out, reports = run(
        cfg(
            batch={"batch_size_sequences": 16, "warmup": ((0, 1), (1024, 2), (2048, 4))},
            optimizer={"beta2_half_life_tokens": 4096.0},
        )
    )
    assert out.status == "completed"
    final = reports[-1][0]
    assert final["step"] == 8 + 4 + 4 and final["tokens_seen"] == 4096
    # steps saved against the initial batch (4 sequences): 4096 / 128 - 16 = 16
    assert final["steps_saved_vs_initial_batch"] == 32 - 16
    assert final["batch_size_sequences_now"] == 16


def test_reports_at_milestones_only_with_monotone_tokens(monkeypatch):
    norms = spy_noise_norms(monkeypatch)
    out, reports = run(cfg())
    toks = [m["tokens_seen"] for m, _ in reports]
    assert toks == [1024, 2048, 3072, 4096]
    m = reports[-1][0]
    assert m["done"] and m["status"] == "completed"
    assert m["flops"] == pytest.approx(build_pretrain(cfg(), torch.device("cpu")).flops_per_token * 4096)
    # B = 8 in 2 micro-batches of 4 (the estimator's minimum), 16 steps of 256 tokens; b_simple at each
    # report is that of the steps up to it
    assert [n[2:] for n in norms] == [(4, 2)] * 16 and [r["step"] for r, _ in reports] == [4, 8, 12, 16]
    for r, _ in reports:
        assert r["b_simple"] == pytest.approx(expected_b_simple(norms[: r["step"]], 0.95), rel=1e-9)
    assert m["b_simple"] > 0
    assert m["val_loss"] < math.log(256)
    assert m["mfu"] is None  # CPU: no MFU, never a guess


def test_the_first_report_of_each_attempt_says_when_its_first_step_ended():
    import time

    t0 = time.time()
    _, reports = run(cfg())
    stamps = [m.get("first_step_unix_s") for m, _ in reports]
    assert stamps[0] is not None and t0 < stamps[0] <= time.time()
    assert stamps[1:] == [None] * (len(reports) - 1)
    _, resumed = run(cfg(), resume=reports[1][1])  # a new attempt reports it again, on its first report
    assert resumed[0][0]["first_step_unix_s"] > stamps[0] and "first_step_unix_s" not in resumed[1][0]


def test_resume_from_checkpoint_is_exact():
    full_out, full = run(cfg())
    states = [s for _, s in full]
    # resume from the state saved with the second report
    resumed_out, resumed = run(cfg(), resume=states[1])
    assert [m["tokens_seen"] for m, _ in resumed] == [3072, 4096]
    for (a, _), (b, _) in zip(full[2:], resumed):
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-5)
        assert b["b_simple"] == pytest.approx(a["b_simple"], rel=1e-5)


def test_a_longer_budget_repeats_the_curve_and_stop_at_loss_ends_it_at_the_first_milestone_below():
    """Token reallocation: a re-run with twice the budget is the same trajectory as far as the first went
    (the schedule does not depend on the horizon), and ``stop_at_loss`` ends a trial at its first milestone
    at or below the loss, as a completed trial."""
    _, short = run(cfg())
    _, long = run(cfg(budget_tokens=8192, eval={"milestones_tokens": (1024, 2048, 3072, 4096, 5120, 6144, 7168, 8192)}))
    assert [m["val_loss"] for m, _ in long[:4]] == pytest.approx([m["val_loss"] for m, _ in short], rel=1e-6)
    assert long[-1][0]["tokens_seen"] == 8192 and long[-1][0]["val_loss"] < short[-1][0]["val_loss"]
    stop = 0.5 * (short[1][0]["val_loss"] + short[2][0]["val_loss"])  # crossed between the 2nd and 3rd milestone
    out, stopped = run(cfg(eval={"stop_at_loss": stop}))
    assert [m["tokens_seen"] for m, _ in stopped] == [1024, 2048, 3072]
    last = stopped[-1][0]
    assert out.status == "completed" and last["done"] and last["status"] == "completed" and last["stopped_at_loss"]
    assert last["val_loss"] <= stop < stopped[1][0]["val_loss"] and not any(
        "stopped_at_loss" in m for m, _ in stopped[:-1]
    )


def test_divergence_is_a_named_outcome():
    out, reports = run(cfg(optimizer={"lr": 50.0, "grad_clip_norm": None}, schedule={"warmup_tokens": 0}))
    assert out.status == "diverged"
    # step 1 (at the initialisation, loss ~ log 256 < 1.5 log 256) is fine; its update at LR 50 sends step 2's
    # loss past 1.5 log 256: the loop reports at once, before the first milestone (1024), without evaluating
    assert len(reports) == 1
    last = reports[-1][0]
    assert last["status"] == "diverged" and last["done"]
    assert last["objective"] == pytest.approx(math.log(256))
    assert last["step"] == 2 and last["tokens_seen"] == 2 * 8 * 32 and math.isnan(last["val_loss"])
    assert last["train_loss"] == pytest.approx(math.log(256), abs=0.2)  # step 1's alone: the diverged step is left out


def test_wsd_schedule_runs_decay_branches_and_counts_their_flops():
    out, reports = run(cfg(schedule={"kind": "wsd", "decay_fraction": 0.25}))
    assert out.status == "completed"
    fpt = build_pretrain(cfg(), torch.device("cpu")).flops_per_token
    # each milestone: a forward (fpt / 3 a token) of the raw weights and of the branch's end over the 1024
    # validation tokens, and a branch of round(0.25 x tokens / 256) steps of 8 x 32 tokens: 1, 2, 3, 4 steps
    per_milestone = [2 * fpt / 3 * 1024 + fpt * n * 256 for n in (1, 2, 3, 4)]
    assert [m["flops_measurement"] for m, _ in reports] == pytest.approx(
        [sum(per_milestone[: i + 1]) for i in range(4)], rel=1e-12
    )
    # the raw weights are the stable branch, untouched by the branches: a constant-LR run's raw weights
    _, constant = run(cfg(eval={"raw_every_milestone": True}))
    raw = [m["val_loss_raw"] for m, _ in reports]
    assert raw == pytest.approx([m["val_loss_raw"] for m, _ in constant], rel=1e-6)
    # and the loss used is the decayed branch's end, lower than the raw weights' at every milestone
    assert all(m["val_loss"] < r for (m, _), r in zip(reports, raw))


def test_noise_scale_needs_two_micro_batches_for_tiny_batches(monkeypatch):
    norms = spy_noise_norms(monkeypatch)
    out, reports = run(cfg(batch={"batch_size_sequences": 2}, optimizer={"beta2_half_life_tokens": 2048.0}))
    # B = 2 is split into 2 micro-batches of 1 sequence so every one of its 64 steps (of 64 tokens) has the
    # two batch sizes the estimator needs
    assert out.status == "completed" and [n[2:] for n in norms] == [(1, 2)] * 64
    final = reports[-1][0]
    assert final["step"] == 64
    assert final["b_simple"] == pytest.approx(expected_b_simple(norms, 0.95), rel=1e-9) and final["b_simple"] > 0


# ---- LR warmup ----------------------------------------------------------------------------------


def test_warmup_ramps_over_four_steps_at_the_largest_batch():
    # the main example's largest batch: 256 x 64 = 16384 tokens per step, warmup_tokens 16384
    step = 256 * 64
    length = warmup_length_tokens(16384, 4, step)
    assert length == 65536
    assert [warmup_factor(s * step, length) for s in (1, 2, 3, 4, 5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    # without the step floor the token warmup alone is one step, at full LR from the first step
    assert [warmup_factor(s * step, warmup_length_tokens(16384, 0, step)) for s in (1, 2)] == [1.0, 1.0]


def test_warmup_at_a_small_batch_is_linear_in_tokens_after_the_step():
    step = 4 * 64  # B = 4: the token warmup (64 steps) is longer than 4 steps
    length = warmup_length_tokens(16384, 4, step)
    assert length == 16384
    for s in (1, 2, 10, 63, 64):
        assert warmup_factor(s * step, length) == pytest.approx(s / 64)
    assert warmup_factor(65 * step, length) == 1.0
    assert warmup_factor(123, 0) == 1.0


def test_the_loop_sets_each_step_lr_from_the_tokens_after_it():
    # B = 8 x T = 32 = 256 tokens per step, warmup_tokens 256 < 4 steps: the LR ramps over 1024 tokens
    c = cfg(
        schedule={"warmup_tokens": 256},
        budget_tokens=1536,
        eval={"milestones_tokens": (256, 512, 768, 1024, 1280, 1536), "eval_tokens": 256},
    )
    out, reports = run(c)
    assert [m["tokens_seen"] for m, _ in reports] == [256, 512, 768, 1024, 1280, 1536]
    assert [m["lr"] for m, _ in reports] == pytest.approx(
        [c.optimizer.lr * f for f in (0.25, 0.5, 0.75, 1.0, 1.0, 1.0)]
    )


# ---- token-weighted gradient of one step ---------------------------------------------------------
#
# Each case is a global batch of 8 rows. ``_micro_batches`` gives the micro-batches a rank computes;
# every split must give the gradient of (sum of token losses) / (loss tokens) over all 8 rows.

CPU = torch.device("cpu")
FT_CONTEXT = 96


def _build(case: dict):
    if case["kind"] == "pretrain":
        return build_pretrain(case["cfg"], CPU)
    from workloads.finetune import build_finetune

    return build_finetune(case["cfg"], CPU)


def _micro_batches(case: dict, work, start: int, count: int, micro: int) -> list:
    """Rows ``start .. start+count`` of the case's global batch, in micro-batches of ``micro`` rows."""
    out = []
    for s in range(start, start + count, micro):
        if case["kind"] == "pretrain":
            out.append(work.train_batch(step=0, global_batch_size_sequences=8, start=s, count=micro))
        else:
            from workloads.finetune.packing import rows_batch

            out.append(rows_batch(work.data.train, case["rows"][s : s + micro]))
    return out


def _params(work) -> list[torch.Tensor]:
    return [p for p in work.model.parameters() if p.requires_grad]


def _step(case: dict, work, micro_batches: list):
    return step_gradient(
        work.model, _params(work), micro_batches, device=CPU, real_tokens=work.real_tokens, noise_scale=True
    )


def _logits(work, x) -> torch.Tensor:
    return (work.model(**x) if isinstance(x, dict) else work.model(input_ids=x)).logits


def _mean_loss_grad(work, x, y) -> list[torch.Tensor]:
    """Gradient of the mean over ``y``'s loss tokens, computed directly."""
    logits = _logits(work, x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=IGNORE_INDEX)
    return list(torch.autograd.grad(loss, _params(work)))


def _flat(grads) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads])


def _rel(a, b) -> float:
    return float((_flat(a) - _flat(b)).norm() / _flat(b).norm())


def _gloo_worker(rank: int, world: int, init_file: str, cases: dict, splits: dict, out_dir: str) -> None:
    """One rank of a real gloo group: the step gradient of each case for each ``{name: micro}`` split."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        res = {}
        for cname, case in cases.items():
            work = _build(case)
            per = 8 // world
            for sname, micro in splits.items():
                sg = _step(case, work, _micro_batches(case, work, rank * per, per, micro))
                res[(cname, sname)] = (
                    sg.grads,
                    sg.loss,
                    sg.loss_tokens,
                    sg.real_tokens,
                    sg.small_sq_norm_mean,
                    sg.big_sq_norm,
                    sg.micro_batches,
                )
        torch.save(res, f"{out_dir}/rank{rank}.pt")
    except BaseException:
        dist.destroy_process_group()
        raise
    leave_group_and_exit()  # ranks.py: together, and past the teardown where gloo aborted a rank now and then


@pytest.fixture(scope="module")
def step_cases(tmp_path_factory):
    """A pretraining batch (every token counts) and a fine-tuning batch of 4 long + 4 short responses."""
    from workloads.finetune import build_finetune, init_checkpoint

    tmp = tmp_path_factory.mktemp("token_weighting")
    ckpt = init_checkpoint(str(tmp / "ckpt"), d_model=32, n_layers=1, n_heads=2, context_length_tokens=128, d_ff=64)
    recs = [{"question": f"long {i}?", "answer": f"{i} " * 30} for i in range(10)]
    recs += [{"question": f"short {i}?", "answer": f"{i % 10}"} for i in range(10)]
    (tmp / "mixed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    ft = cfg(
        name="finetune",
        data={"path": str(tmp / "mixed.jsonl"), "validation_fraction": 0.2},
        model={"context_length_tokens": FT_CONTEXT},
        finetune=FinetuneConfig(
            checkpoint_dir=str(ckpt),
            prompt_field="question",
            response_field="answer",
            prompt_template="Q: {prompt}\nA: ",
            packing="padded",
            truncate=False,
            lora=None,
        ),
    )
    rows = build_finetune(ft, CPU).data.train
    n_loss = (rows.targets != IGNORE_INDEX).sum(1)
    order = torch.argsort(n_loss, descending=True)
    # the 4 longest responses, then the 4 shortest: a 2 x 4 split puts them in different micro-batches
    chosen = torch.cat([order[:4], order[-4:]])
    assert n_loss[chosen[:4]].min() > 5 * n_loss[chosen[4:]].max()
    return {"pretrain": {"kind": "pretrain", "cfg": cfg()}, "finetune": {"kind": "finetune", "cfg": ft, "rows": chosen}}


@pytest.fixture(scope="module")
def two_workers(step_cases, tmp_path_factory):
    """The step gradients computed by a real 2-process gloo group: 2 workers x 4 rows, and 2 x (2 x 2)."""
    tmp = tmp_path_factory.mktemp("gloo")
    mp.spawn(
        _gloo_worker, args=(2, str(tmp / "init"), step_cases, {"2x4": 4, "2x2x2": 2}, str(tmp)), nprocs=2, join=True
    )
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.parametrize("case_name", ["pretrain", "finetune"])
def test_step_gradient_is_the_token_mean_for_every_split(step_cases, two_workers, case_name):
    case = step_cases[case_name]
    work = _build(case)
    ((x, y),) = _micro_batches(case, work, 0, 8, 8)
    # direct: sum of token losses over the 8 rows / their loss tokens
    n_tokens = int((y != IGNORE_INDEX).sum())
    logits = _logits(work, x)
    direct_loss = (
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum")
        / n_tokens
    )
    direct = list(torch.autograd.grad(direct_loss, _params(work)))
    for micro in (8, 4, 2):  # 1 x 8, 2 x 4 and 4 x 2 (accumulation)
        sg = _step(case, work, _micro_batches(case, work, 0, 8, micro))
        assert _rel(sg.grads, direct) < 1e-5, micro
        assert sg.loss == pytest.approx(float(direct_loss.detach()), rel=1e-5)
        assert sg.loss_tokens == n_tokens and sg.micro_batches == 8 // micro
    for rank, res in enumerate(two_workers):
        for split in ("2x4", "2x2x2"):
            grads, loss, loss_tokens, _, _, _, k = res[(case_name, split)]
            assert _rel(grads, direct) < 1e-5, (rank, split)
            assert loss == pytest.approx(float(direct_loss.detach()), rel=1e-5)
            assert loss_tokens == n_tokens and k == (2 if split == "2x4" else 4)
    # the old weighting (mean of micro-batch means) only agrees when every micro-batch has the same tokens
    halves = _micro_batches(case, work, 0, 8, 4)
    old = [(a + b) / 2 for a, b in zip(*(_mean_loss_grad(work, hx, hy) for hx, hy in halves))]
    if case_name == "pretrain":
        assert _rel(old, direct) < 1e-5
    else:
        assert _rel(old, direct) > 0.1


@pytest.mark.parametrize("case_name", ["pretrain", "finetune"])
def test_noise_scale_norms_are_those_of_each_micro_batch_mean_gradient(step_cases, two_workers, case_name):
    case = step_cases[case_name]
    work = _build(case)
    for micro in (4, 2):
        mbs = _micro_batches(case, work, 0, 8, micro)
        sg = _step(case, work, mbs)
        small = [float(_flat(_mean_loss_grad(work, x, y)).pow(2).sum()) for x, y in mbs]
        assert sg.small_sq_norm_mean == pytest.approx(sum(small) / len(small), rel=1e-4)
        assert sg.big_sq_norm == pytest.approx(float(_flat(sg.grads).pow(2).sum()), rel=1e-6)
        gloo = two_workers[0][(case_name, "2x4" if micro == 4 else "2x2x2")]
        assert gloo[4] == pytest.approx(sg.small_sq_norm_mean, rel=1e-4)
        assert gloo[5] == pytest.approx(sg.big_sq_norm, rel=1e-4)
        assert gloo[3] == sg.real_tokens


def test_a_micro_batch_without_loss_tokens_adds_nothing(step_cases):
    case = step_cases["pretrain"]
    work = _build(case)
    ((x, y),) = _micro_batches(case, work, 0, 4, 4)
    alone = _step(case, work, [(x, y)])
    silent = _step(case, work, [(x, y), (x, torch.full_like(y, IGNORE_INDEX))])
    assert _rel(silent.grads, alone.grads) < 1e-6 and silent.loss == pytest.approx(alone.loss, rel=1e-6)
    assert silent.micro_batches == 1 and silent.small_sq_norm_mean == pytest.approx(alone.small_sq_norm_mean, rel=1e-5)


# ---- fault injection ------------------------------------------------------------------------------


def test_a_planned_fault_fires_before_its_report_on_the_first_attempt_only():
    c, hooks = cfg(), [FaultPlan(fail_at_milestone=1)]
    reports = []
    with pytest.raises(RuntimeError, match="injected fault at milestone 1"):
        run_pretrain(
            c, device=torch.device("cpu"), report=lambda m, s: reports.append((m, copy.deepcopy(s))), on_milestone=hooks
        )
    assert [m["tokens_seen"] for m, _ in reports] == [1024]  # milestone 1 was never reported
    # a restored worker group (attempt 1) runs clean from the state of milestone 0
    out, resumed = run(c, resume=reports[0][1], on_milestone=hooks)
    assert out.status == "completed" and [m["tokens_seen"] for m, _ in resumed] == [2048, 3072, 4096]
