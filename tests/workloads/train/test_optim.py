"""The optimizers of ``optimizer.name`` through the real loop (no Ray): each trains (adamw_8bit on CPU too,
bitsandbytes >= 0.50), resumes exactly,
and reports the bytes its state holds per parameter; sgd_momentum under fsdp (a real 2-process gloo group)."""

import copy
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.workloads.ranks import leave_group_and_exit
from tests.workloads.train.test_loop import BASE, cfg, run
from tests.workloads.trial import with_sections
from workloads.config import OptimizerConfig, TrainingConfig, TrialConfig
from workloads.pretrain import build_pretrain, run_pretrain
from workloads.train.optim import build_optimizer, reads_beta2, state_bytes_per_param

#: a peak LR at which each optimizer learns on the tiny model (Adafactor's is a relative step size)
LR = {"adamw": 3e-3, "adamw_8bit": 3e-3, "sgd_momentum": 0.3, "adafactor": 3e-2}
CPU_OPTIMIZERS = sorted(LR)


def _cfg(name: str, **changes) -> TrialConfig:
    return cfg(optimizer={"name": name, "lr": LR[name]}, **changes)


@pytest.fixture(scope="module")
def full_runs():
    """One uninterrupted run of the tiny trial per CPU optimizer: ``{name: (outcome, reports)}``."""
    return {name: run(_cfg(name)) for name in CPU_OPTIMIZERS}


@pytest.mark.parametrize("name", CPU_OPTIMIZERS)
def test_each_optimizer_trains_through_the_loop(full_runs, name):
    out, reports = full_runs[name]
    assert out.status == "completed"
    losses = [m["train_loss"] for m, _ in reports]
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.3, losses  # nats: from ~5.5 (uniform over 256 bytes) down
    assert reports[-1][0]["val_loss"] < math.log(256) - 0.3
    beta2 = [m["beta2"] for m, _ in reports]
    assert reads_beta2(name) == (name in ("adamw", "adamw_8bit"))  # Adam's constant beta2; the others have none
    if reads_beta2(name):
        assert all(0 < b < 1 for b in beta2)
    else:  # no constant beta2: reported as NaN, which the MLflow writer does not log
        assert all(math.isnan(b) for b in beta2)


@pytest.mark.parametrize("name", CPU_OPTIMIZERS)
def test_a_resume_gives_the_uninterrupted_losses_bit_for_bit(full_runs, name):
    _, full = full_runs[name]
    state = full[1][1]
    assert state["optimizer"]["state"], "the checkpoint holds the optimizer's state"
    _, resumed = run(_cfg(name), resume=state)
    assert [m["tokens_seen"] for m, _ in resumed] == [3072, 4096]
    for key in ("train_loss", "val_loss", "val_loss_raw", "grad_norm"):
        assert [m[key] for m, _ in resumed] == [m[key] for m, _ in full[2:]], key


def _n_params(name: str) -> tuple[int, float]:
    """(trainable parameters, the state bytes expected of ``name``) of the tiny model, from its shapes."""
    model = build_pretrain(BASE, torch.device("cpu")).model
    params = [p for p in model.parameters() if p.requires_grad]
    n = sum(p.numel() for p in params)
    if name == "adamw":  # exp_avg + exp_avg_sq in float32, a float32 step per tensor
        return n, (8 * n + 4 * len(params)) / n
    if name == "sgd_momentum":  # one float32 momentum buffer
        return n, 4.0
    if name == "adamw_8bit":
        # bitsandbytes (Dettmers et al. 2022): tensors of 4,096+ elements keep both moments in uint8 with a
        # float32 scale per block of 256 and a 256-entry float32 quantile map per moment; smaller tensors keep
        # float32 moments; the step is a Python int
        b = sum(
            2 * p.numel() + 2 * 4 * math.ceil(p.numel() / 256) + 2 * 256 * 4 if p.numel() >= 4096 else 8 * p.numel()
            for p in params
        )
        return n, b / n
    # adafactor: a row and a column factor for 2-D weights, a full variance otherwise, a float32 step each
    b = sum(4 * (p.shape[0] + p.shape[1]) if p.dim() == 2 else 4 * p.numel() for p in params) + 4 * len(params)
    return n, b / n


@pytest.mark.parametrize("name", CPU_OPTIMIZERS)
def test_the_first_report_carries_the_measured_state_bytes_per_param(full_runs, name):
    _, reports = full_runs[name]
    first = reports[0][0]["optimizer_state_bytes_per_param"]
    n, expected = _n_params(name)
    assert first == pytest.approx(expected, rel=1e-9)
    # adamw_8bit: under AdamW's 8 although most tensors of this tiny model are under 4,096 elements (float32)
    assert {
        "adamw": 7.9 < first < 8.1,
        "adamw_8bit": 2.0 < first < 7.0,
        "sgd_momentum": first == 4.0,
        "adafactor": first < 2.0,
    }[name], first
    assert all("optimizer_state_bytes_per_param" not in m for m, _ in reports[1:])
    assert reports[0][0]["trainable_params"] == n  # what critbatch plan's all-reduce bytes are made of
    _, resumed = run(_cfg(name), resume=reports[1][1])  # a new attempt measures it again
    assert resumed[0][0]["optimizer_state_bytes_per_param"] == first


def test_state_bytes_are_zero_before_the_first_step():
    p = torch.nn.Parameter(torch.ones(4, 4))
    opt = build_optimizer(
        [p], OptimizerConfig(name="sgd_momentum", lr=0.1, beta2_half_life_tokens=1.0), torch.device("cpu")
    )
    assert state_bytes_per_param(opt, 16) == 0.0
    p.grad = torch.ones(4, 4)
    opt.step()
    assert state_bytes_per_param(opt, 16) == 4.0


def test_the_builder_makes_each_class_with_the_configs_hyperparameters():
    params = [torch.nn.Parameter(torch.zeros(3, 2))]
    o = OptimizerConfig(lr=0.01, beta1=0.8, beta2=0.95, eps=1e-7, weight_decay=0.1, beta2_half_life_tokens=1.0)
    cpu = torch.device("cpu")
    adamw = build_optimizer(params, o, cpu)
    assert type(adamw) is torch.optim.AdamW
    assert {k: adamw.param_groups[0][k] for k in ("lr", "betas", "eps", "weight_decay", "foreach", "fused")} == {
        "lr": 0.01,
        "betas": (0.8, 0.95),
        "eps": 1e-7,
        "weight_decay": 0.1,
        "foreach": True,
        "fused": None,
    }
    sgd = build_optimizer(params, OptimizerConfig(**{**o.__dict__, "name": "sgd_momentum"}), cpu)
    assert type(sgd) is torch.optim.SGD
    assert {k: sgd.param_groups[0][k] for k in ("lr", "momentum", "nesterov", "weight_decay", "dampening")} == {
        "lr": 0.01,
        "momentum": 0.8,
        "nesterov": False,
        "weight_decay": 0.1,
        "dampening": 0,
    }
    ada = build_optimizer(params, OptimizerConfig(**{**o.__dict__, "name": "adafactor"}), cpu)
    assert type(ada) is torch.optim.Adafactor
    assert "betas" not in ada.param_groups[0]
    assert (ada.param_groups[0]["lr"], ada.param_groups[0]["weight_decay"]) == (0.01, 0.1)


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))],
)
def test_adamw_8bit_is_bitsandbytes_with_uint8_moments(device):
    p = torch.nn.Parameter(torch.randn(64, 128, device=device))
    o = OptimizerConfig(
        name="adamw_8bit", lr=0.01, beta1=0.8, beta2=0.95, eps=1e-7, weight_decay=0.1, beta2_half_life_tokens=1.0
    )
    opt = build_optimizer([p], o, torch.device(device))
    import bitsandbytes as bnb

    assert type(opt) is bnb.optim.AdamW8bit
    assert {k: opt.param_groups[0][k] for k in ("lr", "betas", "eps", "weight_decay")} == {
        "lr": 0.01,
        "betas": (0.8, 0.95),
        "eps": 1e-7,
        "weight_decay": 0.1,
    }
    p.grad = torch.randn(64, 128, device=device)
    opt.step()
    state = opt.state[p]
    assert state["state1"].dtype == state["state2"].dtype == torch.uint8  # the moments are 8-bit
    assert 2.0 < state_bytes_per_param(opt, p.numel()) < 2.3  # 2 bytes + block scales + quantile maps


def test_adamw_8bit_on_cpu_refuses_a_bitsandbytes_without_the_cpu_kernel(monkeypatch):
    import bitsandbytes

    monkeypatch.setattr(bitsandbytes, "__version__", "0.49.2")  # the last release without it
    o = OptimizerConfig(name="adamw_8bit", lr=0.01, beta2_half_life_tokens=1.0)
    with pytest.raises(ValueError, match=r"adamw_8bit on CPU needs bitsandbytes >= 0.50 .*found 0.49.2"):
        build_optimizer([torch.nn.Parameter(torch.zeros(2))], o, torch.device("cpu"))


def test_adamw_8bit_refuses_a_device_it_has_no_kernel_for():
    o = OptimizerConfig(name="adamw_8bit", lr=0.01, beta2_half_life_tokens=1.0)
    with pytest.raises(ValueError, match="adamw_8bit .*runs on CUDA or CPU, not meta"):
        build_optimizer([torch.nn.Parameter(torch.zeros(2))], o, torch.device("meta"))


def test_the_optimizer_name_round_trips_and_an_unknown_one_is_refused():
    c = _cfg("adafactor")
    assert TrialConfig.from_dict(c.to_dict()) == c
    assert TrialConfig.from_dict(c.to_dict()).optimizer.name == "adafactor"
    d = c.to_dict()
    d["optimizer"]["name"] = "lion"
    with pytest.raises(ValueError, match=r"name\n  Input should be 'adamw', .*input_value='lion'"):
        TrialConfig.from_dict(d)


# ---- sgd_momentum under fsdp: 2 ranks, gloo ---------------------------------------------------------

TWO = with_sections(
    BASE,
    batch={"micro_batch_size_sequences_max": 2},
    budget_tokens=2048,
    eval={"milestones_tokens": (512, 1024, 1536, 2048), "eval_tokens": 512},
    optimizer={"name": "sgd_momentum", "lr": LR["sgd_momentum"]},
)


def _run(c, resume=None):
    reports = []
    run_pretrain(
        c, device=torch.device("cpu"), report=lambda m, s: reports.append((m, copy.deepcopy(s))), resume_state=resume
    )
    return reports


def _two_rank_runs(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    fsdp = with_sections(TWO, training=TrainingConfig(parallelism="fsdp"))
    res = {"ddp": _run(TWO), "fsdp": _run(fsdp)}
    state = [res["fsdp"][1][1] if rank == 0 else None]
    dist.broadcast_object_list(state, src=0)
    res["fsdp_resumed"] = _run(fsdp, resume=copy.deepcopy(state[0]))
    if rank == 0:
        torch.save(res, f"{out_dir}/runs.pt")
    leave_group_and_exit()  # ranks.py: together, and past the teardown where gloo aborted a rank now and then


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp_sgd")
    mp.spawn(_two_rank_runs, args=(str(tmp / "init"), str(tmp)), nprocs=2, join=True)
    return torch.load(tmp / "runs.pt", weights_only=False)


def test_sgd_momentum_under_fsdp_matches_ddp_resumes_exactly_and_sums_its_state(fsdp_runs):
    res = fsdp_runs
    losses = {k: [m["train_loss"] for m, _ in v] for k, v in res.items()}
    assert losses["fsdp"] == pytest.approx(losses["ddp"], rel=1e-5)
    assert losses["fsdp_resumed"] == losses["fsdp"][2:]
    # ddp: the local (whole) state; fsdp: the shards summed over both ranks: both one float32 buffer a parameter
    assert res["ddp"][0][0]["optimizer_state_bytes_per_param"] == 4.0
    assert res["fsdp"][0][0]["optimizer_state_bytes_per_param"] == 4.0
