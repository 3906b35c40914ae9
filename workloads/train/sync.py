"""Replicas that synchronise every ``H`` optimizer steps: local SGD and DiLoCo; and the communication count.

Under ``training.sync.mode`` ``local_sgd`` or ``diloco`` each Ray Train worker is a *replica*: it
steps its own optimizer (the spec's inner optimizer) on the gradient of its own slice of the global
batch (its token-mean loss), with no gradient all-reduce (:class:`workloads.train.step.Stepper`). After
every optimizer step ``s`` with ``(s + 1) % H == 0`` (the global step count, so a resume at any step
is exact), :meth:`ReplicaSync.synchronize`:

- ``local_sgd``: every replica's trainable parameters become their mean over the replicas (one
  all-reduce of the parameters); the optimizer states stay local (Stich 2019, "Local SGD Converges
  Fast and Communicates Little", arXiv:1805.09767; Lin et al. 2020, arXiv:1808.07217).
- ``diloco``: with the anchor ``theta`` (the weights after the last synchronisation, the
  initialisation at first), the outer gradient is ``delta = theta - mean_r(theta_r)``; one step of
  SGD with Nesterov momentum on ``theta`` (``torch.optim.SGD(lr=outer_lr, momentum=outer_momentum,
  nesterov=True)``, outer LR 0.7 and momentum 0.9 by default) and every replica's parameters become
  the new anchor (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language
  Models", arXiv:2311.08105, Algorithm 1 and section 3). Each replica computes the same outer step.

Evaluation at a milestone (which need not fall on a synchronisation) measures the mean over the
replicas of their current weights (the EMA weights for ``constant_ema``: each replica keeps its own
EMA), averaged into a scratch copy of the model (:meth:`ReplicaSync.averaged`): the training state is
untouched and that all-reduce is an evaluation cost, not counted as communication.

Communication accounting (:class:`CommCounters`, every mode): the *payload* of a collective is the
bytes of the tensor handed to it by this worker (a ring all-reduce then moves ``2 (N - 1) / N``
times that per worker on the wire, ``N`` the workers). Counted per optimizer step of training:
ddp, the small counts tensor and the flat gradient buffer; fsdp, its counts and loss tensors plus
FSDP's own all-gathers (each micro-batch: every parameter shard in the forward, the decoder layers'
shards again in the backward) and reduce-scatters (the full gradient, each micro-batch), counted
from the shard sizes, not timed (they run inside FSDP's hooks); local_sgd and diloco, the small
per-step counts tensor and the parameters at each synchronisation. Evaluation collectives (and a
WSD decay branch's) are not counted.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from workloads.config import SyncConfig

__all__ = [
    "CommCounters",
    "ReplicaSync",
    "dist_info",
    "payload_bytes",
    "replica_mean_state_dict",
    "timed_all_reduce",
    "to_cpu",
]


def dist_info() -> tuple[int, int]:
    """``(rank, world size)`` of the default process group, ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def payload_bytes(t: torch.Tensor) -> int:
    """Bytes of ``t`` handed to a collective (``numel * element_size``)."""
    return t.numel() * t.element_size()


def timed_all_reduce(t: torch.Tensor) -> float:
    """``dist.all_reduce(t)`` (sum, in place); the wall seconds spent in it (``time.perf_counter``).

    On gloo the call is synchronous; on NCCL it returns once the kernel is queued, so the time
    spent in a later synchronising call (``.item()``, ``.cpu()``) is not counted.
    """
    t0 = time.perf_counter()
    dist.all_reduce(t)
    return time.perf_counter() - t0


@dataclass
class CommCounters:
    """This worker's communication in training so far (checkpointed as the state's ``comm`` dict).

    Attributes:
        bytes_total: payload bytes handed to collectives (see the module docstring).
        time_s: wall seconds inside the timed collectives.
        syncs: synchronisations (every step under ddp and fsdp with 2+ workers; every ``H`` under
            local_sgd and diloco).
        steps: optimizer steps counted.
    """

    bytes_total: int = 0
    time_s: float = 0.0
    syncs: int = 0
    steps: int = 0

    def add(self, *, bytes_: int, time_s: float, synced: bool) -> None:
        """Count one optimizer step."""
        self.bytes_total += int(bytes_)
        self.time_s += time_s
        self.syncs += int(synced)
        self.steps += 1

    def metrics(self) -> dict[str, float | int]:
        """``comm_bytes_per_step`` (mean over the steps so far), ``comm_bytes_total``, ``comm_time_s``, ``syncs``."""
        return {
            "comm_bytes_per_step": self.bytes_total / self.steps if self.steps else 0.0,
            "comm_bytes_total": self.bytes_total,
            "comm_time_s": self.time_s,
            "syncs": self.syncs,
        }

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)


def to_cpu(obj: Any) -> Any:
    """``obj`` with every tensor (in nested dicts, lists and tuples) detached and copied to CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


class ReplicaSync:
    """The periodic synchronisation of local_sgd and diloco replicas (see the module docstring).

    Args:
        cfg: the mode, ``H`` and DiLoCo's outer optimizer.
        model: this replica's model; ``params`` its trainable parameters (the optimizer's order).

    Raises:
        ValueError: ``cfg.mode`` is ``ddp``, or the process group has fewer than 2 ranks.
    """

    def __init__(self, cfg: SyncConfig, model: torch.nn.Module, params: list[torch.Tensor]):
        if not cfg.local:
            raise ValueError("ReplicaSync is for training.sync.mode local_sgd or diloco")
        self.rank, self.world = dist_info()
        if self.world < 2:
            raise ValueError(
                f"training.sync.mode {cfg.mode!r} needs a process group of at least 2 replicas, got {self.world}"
            )
        self.cfg, self.model, self.params = cfg, model, params
        self.anchor: list[torch.Tensor] = []
        self.outer: torch.optim.Optimizer | None = None
        if cfg.mode == "diloco":  # the initialisation (identical on every rank: the same seed)
            self.anchor = [p.detach().clone().float() for p in params]
            # Nesterov needs a momentum: outer_momentum 0 is plain SGD (and with outer_lr 1, local SGD)
            self.outer = torch.optim.SGD(
                self.anchor, lr=cfg.outer_lr, momentum=cfg.outer_momentum, nesterov=cfg.outer_momentum > 0
            )
        self._scratch: torch.nn.Module | None = None

    def due(self, step: int) -> bool:
        """Whether the replicas synchronise after optimizer step ``step`` (0-based, global)."""
        return (step + 1) % self.cfg.every_steps == 0

    def _mean(self, params: Sequence[torch.Tensor]) -> tuple[torch.Tensor, float]:
        """The flat float32 mean of ``params`` over the replicas (one all-reduce) and the seconds in it."""
        flat = torch.cat([p.detach().reshape(-1).float() for p in params])
        seconds = timed_all_reduce(flat)
        flat /= self.world
        return flat, seconds

    @torch.no_grad()
    def synchronize(self) -> tuple[int, float]:
        """Average (local_sgd) or take the outer step (diloco); ``(payload bytes, seconds in the collective)``."""
        mean, seconds = self._mean(self.params)
        chunks = torch.split(mean, [p.numel() for p in self.params])
        if self.outer is None:
            for p, m in zip(self.params, chunks):
                p.copy_(m.view_as(p))
        else:
            for a, m in zip(self.anchor, chunks):
                a.grad = a - m.view_as(a)
            self.outer.step()
            self.outer.zero_grad(set_to_none=True)
            for p, a in zip(self.params, self.anchor):
                p.copy_(a)
        return payload_bytes(mean), seconds

    @torch.no_grad()
    def averaged(self, model: torch.nn.Module) -> torch.nn.Module:
        """A scratch copy of the model with the mean over the replicas of ``model``'s trainable
        parameters (``model``: this replica's model or its EMA evaluation copy); a collective on every
        rank, not counted as communication. ``model`` is left as it is."""
        if self._scratch is None:
            self._scratch = copy.deepcopy(model)
        src = [p for p in model.parameters() if p.requires_grad]
        dst = [p for p in self._scratch.parameters() if p.requires_grad]
        mean, _ = self._mean(src)
        for d, m in zip(dst, torch.split(mean, [p.numel() for p in src])):
            d.copy_(m.view_as(d))
        return self._scratch

    def state_dict(self) -> dict[str, Any]:
        """The anchor and the outer optimizer (diloco; ``{}`` for local_sgd), on CPU."""
        if self.outer is None:
            return {}
        return {
            "anchor": [a.detach().cpu().clone() for a in self.anchor],
            "outer_optimizer": to_cpu(self.outer.state_dict()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`.

        Raises:
            ValueError: a diloco run resumed from a state without its anchor.
        """
        if self.outer is None:
            return
        if "anchor" not in state:
            raise ValueError("training.sync.mode diloco: the checkpoint has no anchor (saved by another mode)")
        with torch.no_grad():
            for a, s in zip(self.anchor, state["anchor"]):
                a.copy_(s.to(a.device))
        self.outer.load_state_dict(state["outer_optimizer"])


@torch.no_grad()
def replica_mean_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` on CPU with each trainable parameter replaced by its mean over the
    ranks (one all-reduce: a collective on every rank): the weights a finished local_sgd or diloco
    trial saves as its Hugging Face checkpoint. ``model`` is left as it is."""
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([p.detach().reshape(-1).float() for p in params])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    mean_of = {
        p.data_ptr(): m.view_as(p).to("cpu", p.dtype)
        for p, m in zip(params, torch.split(flat, [p.numel() for p in params]))
    }
    live = model.state_dict()
    out = to_cpu(live)
    for name, tensor in live.items():  # by storage: a tied lm_head gets the same mean as the embedding
        mean = mean_of.get(tensor.data_ptr())
        if mean is not None and tensor.shape == mean.shape:
            out[name] = mean
    return out
