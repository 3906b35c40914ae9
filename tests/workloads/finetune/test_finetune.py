"""The fine-tuning workload: full and LoRA training, real-token accounting, checkpoints, FLOPs."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from workloads.api import get_workload
from workloads.config import LoraConfig
from workloads.errors import DataError
from workloads.finetune import FINETUNE_META_FILE, build_finetune, load_finetuned, run_finetune, save_finetuned
from workloads.finetune.lora import finetune_flops_per_token
from workloads.model.flops import flops_per_token, lora_flops_per_token, matmul_params
from workloads.model.hf import shape_of
from workloads.train.evaluation import evaluate
from workloads.train.loop import run_loop

from .conftest import CONTEXT, ft_cfg

pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
CPU = torch.device("cpu")
LORA = LoraConfig(rank=4, alpha=8.0, dropout=0.0, target_modules=("q_proj", "v_proj"))
# tiny checkpoint: d 32, 2 layers, 2 heads, d_ff 64, vocab 256; LoRA r = 4 on q_proj and v_proj (32 x 32 each)
ADAPTER_PARAMS = 2 * 2 * 4 * (32 + 32)


def collect():
    reports = []
    return reports, lambda m, s: reports.append((m, copy.deepcopy(s)))


def test_the_api_entry_of_finetune_runs_run_finetune():
    assert get_workload("finetune").train is run_finetune


def test_full_finetune_counts_real_tokens_and_saves_a_checkpoint(ckpt, qa_file, tmp_path):
    cfg = ft_cfg(ckpt, qa_file)
    work = build_finetune(cfg, CPU)
    assert all(p.requires_grad for p in work.model.parameters())
    assert work.flops_per_token == flops_per_token(shape_of(work.model.config, CONTEXT))
    x, y = work.train_batch(step=0, global_batch_size_sequences=4, start=0, count=4)
    assert work.real_tokens(x, y) == x.n_real_tokens < 4 * CONTEXT
    reports, rep = collect()
    out = run_finetune(cfg, device=CPU, report=rep, save_dir=str(tmp_path / "full"))
    assert out.status == "completed"
    m = [r[0] for r in reports]
    assert [r["status"] for r in m][-1] == "completed" and len(m) == 2
    # tokens seen are the real tokens of the batches drawn, never B * T
    steps = m[-1]["step"]
    assert (
        m[-1]["tokens_seen"]
        == sum(
            work.train_batch(step=s, global_batch_size_sequences=4, start=0, count=4)[0].n_real_tokens
            for s in range(steps)
        )
        >= cfg.budget_tokens
    )
    assert m[-1]["flops"] == pytest.approx(work.flops_per_token * m[-1]["tokens_seen"])
    # it learns: both losses fall between the two reports (by about 0.4 and 0.6 nats here)
    assert m[-1]["val_loss"] < m[0]["val_loss"] - 0.1 and m[-1]["train_loss"] < m[0]["train_loss"] - 0.1
    reloaded = load_finetuned(str(tmp_path / "full"))
    # the checkpoint ships the tokenizer it was trained with: the base checkpoint's, byte for byte
    assert (tmp_path / "full" / "tokenizer.json").read_bytes() == (ckpt / "tokenizer.json").read_bytes()
    meta = json.loads((tmp_path / "full" / FINETUNE_META_FILE).read_text())
    assert meta["lora"] is None and meta["base_checkpoint"] == str(ckpt)
    assert sum(p.numel() for p in reloaded.parameters()) == sum(p.numel() for p in work.model.parameters())


def test_train_batches_are_deterministic_and_split_across_micro_batches(ckpt, qa_file):
    work = build_finetune(ft_cfg(ckpt, qa_file, packing="padded"), CPU)
    whole, yw = work.train_batch(step=3, global_batch_size_sequences=8, start=0, count=8)
    again, _ = work.train_batch(step=3, global_batch_size_sequences=8, start=0, count=8)
    parts = [work.train_batch(step=3, global_batch_size_sequences=8, start=s, count=4) for s in (0, 4)]
    assert torch.equal(whole["input_ids"], again["input_ids"])
    assert torch.equal(whole["input_ids"], torch.cat([p[0]["input_ids"] for p in parts]))
    assert torch.equal(yw, torch.cat([p[1] for p in parts]))
    assert whole.n_real_tokens == sum(p[0].n_real_tokens for p in parts)
    other, _ = work.train_batch(step=4, global_batch_size_sequences=8, start=0, count=8)
    assert not torch.equal(whole["input_ids"], other["input_ids"])


def test_lora_trains_only_the_adapters(ckpt, qa_file):
    cfg = ft_cfg(ckpt, qa_file, lora=LORA)
    work = build_finetune(cfg, CPU)
    trainable = {n: p for n, p in work.model.named_parameters() if p.requires_grad}
    assert sum(p.numel() for p in trainable.values()) == ADAPTER_PARAMS == work.adapter_params
    assert len(trainable) == 2 * 2 * 2 and all("lora_A" in n or "lora_B" in n for n in trainable)
    frozen = {n: p.detach().clone() for n, p in work.model.named_parameters() if not p.requires_grad}
    before = {n: p.detach().clone() for n, p in trainable.items()}
    reports, rep = collect()
    assert run_loop(cfg, work, device=CPU, report=rep).status == "completed"
    for n, p in work.model.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]), n
    assert all(not torch.equal(p, before[n]) for n, p in trainable.items() if "lora_B" in n)


def test_lora_checkpoint_reloads_with_the_same_validation_loss(ckpt, qa_file, tmp_path):
    from peft import PeftModel

    cfg = ft_cfg(ckpt, qa_file, lora=LORA)
    work = build_finetune(cfg, CPU)
    _, rep = collect()
    run_loop(cfg, work, device=CPU, report=rep)
    val = work.val_batches()
    want = evaluate(work.model, val, CPU, None)
    save_finetuned(work, str(tmp_path / "lora"))
    files = {p.name for p in (tmp_path / "lora").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", FINETUNE_META_FILE} <= files
    assert "config.json" not in files  # the adapter only; the base stays where it is
    again = load_finetuned(str(tmp_path / "lora"))
    assert isinstance(again, PeftModel)
    assert evaluate(again, val, CPU, None) == pytest.approx(want, rel=1e-6)
    # the adapter directory is itself a checkpoint to fine-tune from (merged into its base)
    work2 = build_finetune(ft_cfg(tmp_path / "lora", qa_file), CPU)
    assert evaluate(work2.model, val, CPU, None) == pytest.approx(want, rel=1e-5)


def test_lora_flops_per_token_against_a_hand_count(ckpt):
    T = 32
    # N_matmul per layer: attention 4 * 32 * 32 = 4096, gated MLP 3 * 32 * 64 = 6144; two layers
    n_matmul = 2 * (4096 + 6144)
    hf = __import__("transformers").AutoConfig.from_pretrained(str(ckpt))
    assert matmul_params(shape_of(hf, T)) == n_matmul == 20480
    attention = 12 * 2 * T * 32  # 12 n_layer n_ctx d_attn
    frozen_head = 4 * 32 * 256  # forward + activation gradient of the LM head
    hand = 4 * n_matmul + 6 * ADAPTER_PARAMS + attention + frozen_head
    assert hand == 145408
    assert finetune_flops_per_token(str(ckpt), T, LORA) == hand
    assert lora_flops_per_token(shape_of(hf, T), ADAPTER_PARAMS) == hand
    full = 6 * n_matmul + attention + 6 * 32 * 256
    assert finetune_flops_per_token(str(ckpt), T, None) == full == 196608
    # about 2/3 of full fine-tuning when the adapters are small (methodology section 9.4)
    assert 0.6 < hand / full < 0.8


def test_missing_checkpoint_is_a_clear_error_not_a_worker_crash(qa_file, tmp_path):
    with pytest.raises(DataError, match=r"finetune.checkpoint_dir: directory not found"):
        run_finetune(ft_cfg(tmp_path / "gone", qa_file), device=CPU, report=lambda m, s: None)
    with pytest.raises(DataError, match="needs a 'finetune' section"):
        run_finetune(ft_cfg(tmp_path, qa_file, finetune=None), device=CPU, report=lambda m, s: None)
