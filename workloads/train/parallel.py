"""How a trial's model runs: FSDP2 sharding, ``torch.compile``, activation checkpointing, precision.

None of it changes what a step computes (:mod:`workloads.train.step`). ``ddp`` is the hand-made data
parallelism of :func:`workloads.train.step.step_gradient`, untouched. ``fsdp`` applies FSDP2
``fully_shard`` to every decoder layer (the classes a Hugging Face model names in
``_no_split_modules``) and to the root, over a 1-D device mesh of all ranks; parameters, gradients
and optimizer state are then DTensors sharded on dim 0, and each module's weights are all-gathered
for its forward and backward. Gradients are reduce-scattered with a *sum* (divide factor 1, sum-only
collectives: gloo has no pre-multiplied sum), because the loss is already divided by the global
batch's loss tokens, so the result is the DDP path's gradient (:func:`sharded_step_gradient`).

Checkpoints under ``fsdp`` have the DDP format: the model's full state dict (same keys), the
optimizer's ``state_dict()`` keyed by parameter index, the EMA buffers as full tensors, gathered
with ``torch.distributed.checkpoint.state_dict`` (full state dicts, offloaded to rank 0's CPU), so a
checkpoint resumes under either parallelism.
"""

from __future__ import annotations

import copy
from typing import Any, Protocol, cast

import torch
import torch.distributed as dist

from workloads.config import TrainingConfig

__all__ = [
    "adamw_impl",
    "autocast_dtype",
    "copy_full_into",
    "decoder_layers",
    "fsdp_bytes_per_micro_batch",
    "full_model_state",
    "full_optimizer_state",
    "full_tensors",
    "global_sq_norm",
    "is_sharded",
    "load_model_state",
    "load_optimizer_state",
    "prepare_model",
]


def autocast_dtype(mixed_precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of ``training.mixed_precision`` on ``device``: bf16 or None (float32).

    ``auto`` is bf16 on CUDA and float32 elsewhere (what the loop always did); ``bf16`` is bf16 on
    any device (CPU autocast on CPU); ``fp32`` never autocasts.

    Raises:
        ValueError: an unknown value.
    """
    if mixed_precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    if mixed_precision == "bf16":
        return torch.bfloat16
    if mixed_precision == "fp32":
        return None
    raise ValueError(f"training.mixed_precision must be 'auto', 'bf16' or 'fp32', got {mixed_precision!r}")


def adamw_impl(device: torch.device) -> dict[str, bool]:
    """AdamW's implementation keyword: ``fused=True`` on CUDA, else ``foreach=True`` (as always on CPU)."""
    return {"fused": True} if device.type == "cuda" else {"foreach": True}


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a ``transformers`` model: the modules whose class the model names in
    ``_no_split_modules`` (``LlamaDecoderLayer``, ``GPT2Block``, ...), in order.

    Raises:
        ValueError: the model names none, or none is found.
    """
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"training: cannot find the decoder layers of {type(model).__name__} "
            f"(_no_split_modules={sorted(names)}): fsdp and compile need them"
        )
    return layers


class _ActivationCheckpointing(Protocol):
    """A ``transformers`` model's activation checkpointing switch."""

    def activation_checkpointing_enable(self, *, activation_checkpointing_kwargs: dict[str, Any]) -> None: ...


def prepare_model(
    model: torch.nn.Module, training: TrainingConfig, *, world: int, eval_copy: bool, device: torch.device
) -> torch.nn.Module | None:
    """Apply ``training`` to ``model`` in place; the weight EMA's evaluation copy when ``eval_copy``.

    In order: activation checkpointing (``transformers``' ``activation_checkpointing_enable``, every
    decoder layer, non-reentrant); the evaluation copy (a deep copy made here, before
    ``compile`` and sharding, so it never shares a compiled graph or FSDP state with ``model``);
    ``compile`` (``Module.compile``, in place, so state-dict keys do not change: the whole model
    under ddp, each decoder layer under fsdp); under fsdp, ``fully_shard`` of each decoder layer and
    the root, of ``model`` and of the copy (evaluated with the same collectives on every rank).

    Returns:
        the evaluation copy, or None.

    Raises:
        ValueError: ``fsdp`` with fewer than 2 ranks; a model without known decoder layers.
    """
    sharded = training.parallelism == "fsdp"
    if sharded and world < 2:
        raise ValueError(
            f"training.parallelism 'fsdp' needs a process group of at least 2 ranks, got {world}: "
            f"use 'ddp' (the same mathematics) or more workers"
        )
    if training.activation_checkpointing:
        checkpointing = cast(_ActivationCheckpointing, model)  # a ``transformers`` model
        checkpointing.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    copy_ = copy.deepcopy(model) if eval_copy else None
    if training.compile:
        for m in decoder_layers(model) if sharded else [model]:
            m.compile()
    if sharded:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (world,))
        for m in [model] + ([copy_] if copy_ is not None else []):
            _shard(m, mesh)
    return copy_


def _shard(model: torch.nn.Module, mesh) -> None:
    """``fully_shard`` each decoder layer, then the root; sum reductions, divide factor 1."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            # the loss is divided by the global batch's loss tokens already: sum, never average
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``fully_shard`` was applied to ``model`` (its root)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _options(*, gather: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=gather)


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full (unsharded) model state dict on rank 0's CPU (``{}`` elsewhere); a collective: call
    it on every rank. Its keys are those of the unsharded model's ``state_dict()``."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    # a full state dict of a model: every value is a plain tensor (torch types it as any state value)
    return cast(dict[str, torch.Tensor], get_model_state_dict(model, options=_options(gather=True)))


def load_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a full model state dict (every rank holds it) into the sharded ``model``; a collective.
    ``state`` is left as it was (the loader would put DTensors into the dict it is given)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(model, dict(state), options=_options(gather=False))


def _trainable_names(model: torch.nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


def full_optimizer_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's full state in ``Optimizer.state_dict()`` form (keyed by parameter index, as
    under ddp) on rank 0 (``{}`` elsewhere); a collective."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    full: dict[str, Any] = get_optimizer_state_dict(model, opt, options=_options(gather=True))
    if not full:
        return {}
    index = {n: i for i, n in enumerate(_trainable_names(model))}
    return {
        "state": {index[n]: s for n, s in full["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in full["param_groups"]],
    }


def load_optimizer_state(model: torch.nn.Module, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a state of :func:`full_optimizer_state`'s form (every rank holds it); a collective."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    names = _trainable_names(model)
    full = {
        "state": {names[i]: dict(s) for i, s in state["state"].items()},  # copies: ``state`` is left as it was
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]],
    }
    set_optimizer_state_dict(model, opt, full, options=_options(gather=False))


def full_tensors(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor whole, on CPU (a DTensor is gathered: a collective on every rank)."""
    from torch.distributed.tensor import DTensor

    return [(t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu() for t in tensors]


def copy_full_into(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """Copy whole tensors ``src`` into ``dst`` (a DTensor takes its own shard; no communication)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    with torch.no_grad():
        for d, s in zip(dst, src):
            if isinstance(d, DTensor):
                s = distribute_tensor(s.to(d.device, d.dtype), d.device_mesh, d.placements, src_data_rank=None)
            d.copy_(s)


def global_sq_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The squared norm (float32 scalar) of ``tensors`` taken together; for DTensors the squares of
    the local shards are summed over the ranks (an all-reduce, on every rank)."""
    from torch.distributed.tensor import DTensor

    if not tensors or not isinstance(tensors[0], DTensor):
        return torch.stack(torch._foreach_norm(tensors)).float().pow(2).sum()  # pyright: ignore[reportPrivateImportUsage]  # private foreach API
    local = [cast(DTensor, t).to_local() for t in tensors]  # all DTensors (one model's sharded tensors)
    sq = torch.stack([n.float() for n in torch._foreach_norm(local)]).pow(2).sum()  # pyright: ignore[reportPrivateImportUsage]  # private foreach API
    dist.all_reduce(sq)
    return sq


def fsdp_bytes_per_micro_batch(model: torch.nn.Module) -> int:
    """Payload bytes this rank hands to FSDP2's own collectives per training micro-batch (counted, not timed).

    The forward all-gathers every parameter (input: this rank's shard), the backward all-gathers
    the decoder layers' again (FSDP2 keeps the root's gathered after the forward:
    ``reshard_after_forward`` is False for the root), and each trainable parameter's full gradient
    is reduce-scattered (input: the whole, unpadded gradient). FSDP's padding of uneven shards is
    not counted. Convention: ``workloads.train.sync``.
    """
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    def local_bytes(p: torch.Tensor) -> int:
        t = p.to_local() if isinstance(p, DTensor) else p
        return t.numel() * t.element_size()

    # the sharded decoder layers: every FSDP module but the root (fully_shard renames their classes)
    in_layers = {id(p) for m in model.modules() if isinstance(m, FSDPModule) and m is not model for p in m.parameters()}
    params = list(model.parameters())
    forward = sum(local_bytes(p) for p in params)
    backward = sum(local_bytes(p) for p in params if id(p) in in_layers)
    reduce_scatter = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    return forward + backward + reduce_scatter
