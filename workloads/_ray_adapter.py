"""The one place ``workloads`` touches Ray Train: the per-worker function of a ``TorchTrainer``.

Checkpoints: rank 0 writes the loop state (model, optimizer, weight EMA, noise-scale EMAs, data
position = step, RNG) with each milestone report; a restarted worker group resumes from
``ray.train.get_checkpoint()``.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch

import ray.train
import ray.train.torch

from workloads.config import TrialConfig
from workloads.registry import get_entry

__all__ = ["train_fn_per_worker", "STATE_FILE"]

STATE_FILE = "trial_state.pt"


def _load_state(checkpoint: ray.train.Checkpoint | None) -> dict[str, Any] | None:
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as d:
        return torch.load(os.path.join(d, STATE_FILE), weights_only=False, map_location="cpu")


def train_fn_per_worker(config: dict[str, Any]) -> None:
    """Ray Train worker entry: run the trial's workload, reporting at token milestones.

    ``config`` is :meth:`TrialConfig.to_dict` plus an optional ``"_save_dir"`` (a folder on shared
    storage where rank 0 saves the final Hugging Face checkpoint).
    """
    config = dict(config)
    save_dir = config.pop("_save_dir", None)
    cfg = TrialConfig.from_dict(config)
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads()))))
    rank = ray.train.get_context().get_world_rank()
    device = ray.train.torch.get_device()
    resume_state = _load_state(ray.train.get_checkpoint())

    def report(metrics: dict[str, Any], state: dict[str, Any] | None) -> None:
        clean = {k: v for k, v in metrics.items() if v is not None}
        if state is None:
            ray.train.report(clean)
            return
        with tempfile.TemporaryDirectory() as tmp:
            torch.save(state, os.path.join(tmp, STATE_FILE))
            ray.train.report(clean, checkpoint=ray.train.Checkpoint.from_directory(tmp))

    entry = get_entry(cfg.workload)
    entry(cfg, device=device, report=report, resume_state=resume_state, save_dir=save_dir if rank == 0 else None)
