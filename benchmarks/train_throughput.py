"""Training tokens/s of a trial's loop against a plain PyTorch loop, under ddp and fsdp.

    python benchmarks/train_throughput.py [--d-model 256] [--n-layers 4] [--context 128] [--batch 16]
                                          [--steps 30] [--warmup-steps 3] [--repeats 3]

Two processes (one CPU thread each, a gloo group, as two Ray Train workers of one trial), the same
Hugging Face Llama (the spec shorthand), the same Tiny Shakespeare batches, the same global batch
(``--batch`` sequences of ``--context`` tokens, one micro-batch per worker), AdamW, clip 1.0:

* trial: ``workloads.train.loop.run_loop`` as a trial runs it (``workloads.pretrain.build_pretrain``), with
  ``resources.parallelism`` ddp or fsdp; its tokens/s is the loop's own ``tokens_per_s`` metric of
  its last report (training time only: evaluation excluded), over ``--steps`` steps after
  ``--warmup-steps``. The weight EMA is on (the default schedule); the noise-scale estimator and
  the per-milestone checkpoint are off (see docs/benchmarks.md).
* plain: what one would write by hand: ``DistributedDataParallel`` or FSDP2 ``fully_shard`` (each
  decoder layer and the root, defaults but sum-only collectives, which gloo needs) and
  ``loss.backward(); clip_grad_norm_; opt.step()`` on the mean token loss.

Trial and plain alternate ``--repeats`` times, each trial run followed by its plain run, so a pair
sees about the same load from other processes on the machine. The last line is
``ratio_ddp=X ratio_fsdp=Y``: the median over the pairs of trial tokens/s over plain tokens/s
(goal >= 0.95); the ratio of the two medians is printed too (it mixes runs minutes apart).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORLD = 2


def trial_config(args, parallelism: str):
    """The trial: ``warmup_steps + steps`` optimizer steps, a report after the warmup and at the end."""
    from workloads.config import (
        BatchConfig,
        DataConfig,
        EvalConfig,
        ModelConfig,
        NoiseScaleConfig,
        OptimizerConfig,
        ScheduleConfig,
        TrainingConfig,
        TrialConfig,
        WorkloadConfig,
    )

    step_tokens = args.batch * args.context
    return TrialConfig(
        trial_id="bench",
        workload=WorkloadConfig(
            model=ModelConfig(
                d_model=args.d_model,
                n_layers=args.n_layers,
                n_heads=4,
                d_ff=4 * args.d_model,
                context_length_tokens=args.context,
            ),
            data=DataConfig(path=str(ROOT / "data" / "tinyshakespeare" / "input.txt")),
        ),
        budget_tokens=(args.warmup_steps + args.steps) * step_tokens,
        optimizer=OptimizerConfig(lr=1e-3, beta2=0.99, beta2_half_life_tokens=1e5, grad_clip_norm=1.0),
        schedule=ScheduleConfig(warmup_tokens=0, warmup_min_steps=1, ema_half_life_tokens=1e5),
        batch=BatchConfig(batch_size_sequences=args.batch, micro_batch_size_sequences_max=args.batch // WORLD),
        eval=EvalConfig(
            milestones_tokens=(args.warmup_steps * step_tokens, (args.warmup_steps + args.steps) * step_tokens),
            eval_tokens=args.context * 8,
            checkpoint_every_milestones=0,
        ),
        noise_scale=NoiseScaleConfig(enabled=False),
        training=TrainingConfig(parallelism=parallelism),
    )


def trial_tps(args, parallelism: str) -> float:
    """The trial loop's tokens/s over its measured steps (its last report's ``tokens_per_s``)."""
    import torch

    from workloads.pretrain import build_pretrain
    from workloads.train.loop import run_loop

    cfg = trial_config(args, parallelism)
    reports = []
    run_loop(
        cfg, build_pretrain(cfg, torch.device("cpu")), device=torch.device("cpu"), report=lambda m, s: reports.append(m)
    )
    return float(reports[-1]["tokens_per_s"])


def plain_tps(args, parallelism: str) -> float:
    """A hand-written DDP or FSDP2 loop on the same model and batches: tokens/s over the measured steps."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from workloads.pretrain import build_pretrain

    cfg = trial_config(args, parallelism)
    work = build_pretrain(cfg, torch.device("cpu"))
    model = work.model
    if parallelism == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, fully_shard

        mesh = init_device_mesh("cpu", (WORLD,))
        for layer in [m for m in model.modules() if type(m).__name__ in model._no_split_modules]:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)  # gloo has no AVG / pre-multiplied sum
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0, foreach=True)
    rank, per = dist.get_rank(), args.batch // WORLD
    t0 = 0.0
    for step in range(args.warmup_steps + args.steps):
        if step == args.warmup_steps:
            dist.barrier()
            t0 = time.perf_counter()
        x, y = work.train_batch(step=step, global_batch_size_sequences=args.batch, start=rank * per, count=per)
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    float(loss.detach())
    dist.barrier()
    return args.steps * args.batch * args.context / (time.perf_counter() - t0)


def _worker(rank: int, init_file: str, args, out_file: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    results: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for par in ("ddp", "fsdp"):
            for side, fn in (("trial", trial_tps), ("plain", plain_tps)):
                results.setdefault(f"{side}_{par}", []).append(fn(args, par))
    if rank == 0:
        import json

        Path(out_file).write_text(json.dumps(results))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch", type=int, default=16, help="global batch, sequences (one micro-batch per worker)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    import json

    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results.json")
        t0 = time.perf_counter()
        mp.spawn(_worker, args=(os.path.join(tmp, "init"), args, out), nprocs=WORLD, join=True)
        results = json.loads(Path(out).read_text())
    print(
        f"model: llama d={args.d_model} layers={args.n_layers} T={args.context}; batch {args.batch} sequences "
        f"= {args.batch * args.context} tokens/step over {WORLD} processes; {args.steps} steps x {args.repeats} repeats "
        f"({time.perf_counter() - t0:.0f} s)"
    )
    med = {k: statistics.median(v) for k, v in results.items()}
    for k, v in results.items():
        print(f"{k}: median {med[k]:.0f} tokens/s  (runs: {', '.join(f'{x:.0f}' for x in v)})")
    ratios = {}
    for par in ("ddp", "fsdp"):  # a trial run and the plain run right after it saw about the same load
        pairs = [t / p for t, p in zip(results[f"trial_{par}"], results[f"plain_{par}"])]
        ratios[par] = statistics.median(pairs)
        print(
            f"{par}: trial/plain per adjacent pair {', '.join(f'{r:.2f}' for r in pairs)}; ratio of the medians "
            f"{med[f'trial_{par}'] / med[f'plain_{par}']:.3f}"
        )
    assert all(math.isfinite(r) for r in ratios.values())
    print(f"ratio_ddp={ratios['ddp']:.3f} ratio_fsdp={ratios['fsdp']:.3f}")


if __name__ == "__main__":
    main()
