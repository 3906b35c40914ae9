"""FSDP2 against the hand-made DDP path (a real 2-process gloo group), and compile, activation
checkpointing and bf16 CPU autocast in one process: the same losses, an exact FSDP resume, the
checkpoint in the DDP format."""

import copy
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.workloads.ranks import leave_group_and_exit
from tests.workloads.train.test_loop import BASE
from tests.workloads.trial import with_sections
from workloads.config import TrainingConfig
from workloads.pretrain import run_pretrain
from workloads.train.batching import min_micro_batches_total
from workloads.train.parallel import autocast_dtype

# 8 sequences per step, micro-batches of 2: 2 accumulation steps on each of 2 workers; 8 steps
TWO = with_sections(
    BASE,
    batch={"micro_batch_size_sequences_max": 2},
    budget_tokens=2048,
    eval={"milestones_tokens": (512, 1024, 1536, 2048), "eval_tokens": 512},
)
FSDP = TrainingConfig(parallelism="fsdp")


def _run(c, resume=None, save_dir=None):
    reports = []
    out = run_pretrain(
        c,
        device=torch.device("cpu"),
        report=lambda m, s: reports.append((m, copy.deepcopy(s))),
        resume_state=resume,
        save_dir=save_dir,
    )
    return out, reports


def _two_rank_runs(rank: int, init_file: str, out_dir: str) -> None:
    """Every comparison's runs, in one process group (a spawn costs more than the runs)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    res = {}
    res["ddp"] = _run(TWO)[1]
    res["fsdp"] = _run(with_sections(TWO, training=FSDP), save_dir=f"{out_dir}/hf" if rank == 0 else None)[1]
    state = [res["fsdp"][1][1] if rank == 0 else None]
    dist.broadcast_object_list(state, src=0)  # every rank restores from rank 0's checkpoint, as Ray Train does
    # a copy each: a loaded optimizer keeps (and steps) the very tensors it was given
    res["fsdp_resumed"] = _run(with_sections(TWO, training=FSDP), resume=copy.deepcopy(state[0]))[1]
    res["ddp_from_fsdp"] = _run(TWO, resume=copy.deepcopy(state[0]))[1]
    wsd = {
        "schedule": {"kind": "wsd", "decay_fraction": 0.25},
        "noise_scale": {"enabled": False},
        "optimizer": {"grad_clip_norm": None},
    }
    res["ddp_wsd"] = _run(with_sections(TWO, **wsd))[1]
    res["fsdp_wsd_ac"] = _run(
        with_sections(TWO, **wsd, training=TrainingConfig(parallelism="fsdp", activation_checkpointing=True))
    )[1]
    if rank == 0:
        torch.save(res, f"{out_dir}/runs.pt")
    leave_group_and_exit()  # ranks.py: together, and past the teardown where gloo aborted a rank now and then


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp")
    mp.spawn(_two_rank_runs, args=(str(tmp / "init"), str(tmp)), nprocs=2, join=True)
    return torch.load(tmp / "runs.pt", weights_only=False), tmp


def _losses(reports, key="train_loss"):
    return [m[key] for m, _ in reports]


def test_fsdp_gives_the_ddp_losses_with_accumulation(runs):
    res, _ = runs
    for a, b in [("ddp", "fsdp"), ("ddp_wsd", "fsdp_wsd_ac")]:
        for key in ("train_loss", "val_loss", "grad_norm"):
            assert _losses(res[b], key) == pytest.approx(_losses(res[a], key), rel=1e-5), (a, b, key)
    assert all(math.isfinite(m["b_simple"]) for m, _ in res["fsdp"][1:])  # two micro-batches per worker


def test_the_fsdp_checkpoint_has_the_ddp_format_and_weights(runs):
    res, _ = runs
    d, f = res["ddp"][1][1], res["fsdp"][1][1]
    assert d.keys() == f.keys()
    assert d["model"].keys() == f["model"].keys()
    for k in d["model"]:
        assert torch.allclose(d["model"][k], f["model"][k], atol=1e-6), k
    assert d["optimizer"]["state"].keys() == f["optimizer"]["state"].keys()
    assert [g["params"] for g in d["optimizer"]["param_groups"]] == [
        g["params"] for g in f["optimizer"]["param_groups"]
    ]
    for i, s in d["optimizer"]["state"].items():
        for k, v in s.items():
            assert torch.allclose(v, f["optimizer"]["state"][i][k], atol=1e-6), (i, k)
    assert [e.shape for e in d["ema_raw"]] == [e.shape for e in f["ema_raw"]]

    def timeless(loop):
        return {k: v for k, v in loop.items() if k != "train_time_s"}

    assert timeless(d["loop"]) == timeless(f["loop"]) and d["noise_scale"].keys() == f["noise_scale"].keys()


def test_an_fsdp_resume_equals_the_uninterrupted_run_and_ddp_resumes_it_too(runs):
    res, _ = runs
    tail = res["fsdp"][2:]
    for key in ("train_loss", "val_loss", "val_loss_raw", "grad_norm", "b_simple"):
        assert _losses(res["fsdp_resumed"], key) == _losses(tail, key), key
    assert _losses(res["ddp_from_fsdp"]) == pytest.approx(_losses(tail), rel=1e-5)


def test_fsdp_saves_the_full_hugging_face_checkpoint(runs):
    from transformers import AutoModelForCausalLM

    from workloads.pretrain import build_pretrain
    from workloads.train.evaluation import evaluate

    res, tmp = runs
    model = AutoModelForCausalLM.from_pretrained(tmp / "hf")
    val = build_pretrain(TWO, torch.device("cpu")).val_batches()
    end = res["fsdp"][-1][0]
    assert end["done"] and evaluate(model, val, torch.device("cpu"), None) == pytest.approx(
        end["val_loss_raw"], rel=1e-6
    )


def test_fsdp_plans_two_micro_batches_per_worker_for_the_noise_scale():
    assert min_micro_batches_total(True, "fsdp", 4) == 8
    assert min_micro_batches_total(True, "ddp", 4) == 2
    assert min_micro_batches_total(False, "fsdp", 4) == 1


def test_fsdp_in_one_process_is_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="'fsdp' needs a process group of at least 2 ranks, got 1"):
        _run(with_sections(TWO, training=FSDP))


# ---- one process ------------------------------------------------------------------------------

ONE = with_sections(TWO, budget_tokens=1024, eval={"milestones_tokens": (512, 1024), "eval_tokens": 512})


def test_activation_checkpointing_gives_identical_losses():
    plain = _run(ONE)[1]
    ac = _run(with_sections(ONE, training=TrainingConfig(activation_checkpointing=True)))[1]
    assert _losses(ac) == _losses(plain) and _losses(ac, "val_loss") == _losses(plain, "val_loss")


def test_mixed_precision_fp32_is_auto_on_cpu_and_bf16_autocast_runs_close():
    assert autocast_dtype("auto", torch.device("cpu")) is None
    assert autocast_dtype("auto", torch.device("cuda")) is torch.bfloat16
    assert autocast_dtype("bf16", torch.device("cpu")) is torch.bfloat16
    plain = _run(ONE)[1]
    assert _losses(_run(with_sections(ONE, training=TrainingConfig(mixed_precision="fp32")))[1]) == _losses(plain)
    bf16 = _run(with_sections(ONE, training=TrainingConfig(mixed_precision="bf16")))[1]
    assert _losses(bf16) != _losses(plain)  # autocast is on
    assert _losses(bf16) == pytest.approx(_losses(plain), rel=2e-2)
    assert _losses(bf16, "val_loss") == pytest.approx(_losses(plain, "val_loss"), rel=2e-2)


def test_compile_gives_the_same_losses():
    plain = _run(ONE)[1]
    compiled = _run(with_sections(ONE, training=TrainingConfig(compile=True)))[1]
    assert _losses(compiled) == pytest.approx(_losses(plain), rel=1e-4)
    assert _losses(compiled, "val_loss") == pytest.approx(_losses(plain, "val_loss"), rel=1e-4)


@pytest.mark.parametrize(
    "kw,field",
    [
        ({"parallelism": "zero"}, "parallelism"),
        ({"mixed_precision": "fp16"}, "mixed_precision"),
        ({"compile": "yes"}, "compile"),
    ],
)
def test_training_config_refuses_bad_values(kw, field):
    with pytest.raises(ValueError, match=rf"for TrainingConfig\n{field}\n"):  # pydantic names the field
        TrainingConfig(**kw)


def test_fsdp_counts_its_all_gathers_and_reduce_scatters(runs):
    from workloads.pretrain import build_pretrain

    res, _ = runs
    named = dict(build_pretrain(TWO, torch.device("cpu")).model.named_parameters())

    def half(p):
        return -(-p.shape[0] // 2) * p[0].numel() * 4 if p.shape[0] > 1 else 0

    forward = sum(half(p) for p in named.values())
    backward = sum(half(p) for n, p in named.items() if ".layers." in n)  # the root stays gathered for backward
    reduce_scatter = sum(4 * p.numel() for p in named.values())
    k = 2  # accumulation steps per worker
    explicit = (2 + k) * 8 + 2 * 4  # float64 counts [loss tokens, real tokens, n_j...] + float32 [squares, loss]
    m = res["fsdp"][-1][0]
    assert m["comm_bytes_per_step"] == k * (forward + backward + reduce_scatter) + explicit
    assert m["syncs"] == m["step"] and m["comm_time_s"] > 0
