"""A bias-corrected EMA of the trainable weights whose half-life is fixed in tokens (Zhang et al. 2024).

After a step that trained on ``n`` tokens, ``decay = 0.5 ** (n / half_life_tokens)`` and every
buffer becomes ``decay * buffer + (1 - decay) * weight`` (kept in float32); the weight of the EMA,
``1 - prod(decay)``, divides it out when the EMA weights are evaluated, so early milestones are not
biased towards the zero start. A half-life in tokens makes the average span the same data at
every batch size.
"""

from __future__ import annotations

import copy

import torch

__all__ = ["WeightEMA"]


class WeightEMA:
    """The EMA buffers of ``params`` and a copy of ``model`` to evaluate them in.

    Args:
        model: the trained model (deep-copied once, at construction, into :attr:`eval_model`,
            unless ``eval_model`` is given).
        params: its trainable parameters, in the optimizer's order (DTensors under FSDP: the
            buffers are then sharded as they are).
        half_life_tokens: the EMA's half-life in tokens.
        eval_model: a copy of ``model`` made earlier (``workloads.train.parallel.prepare_model``: before
            ``compile`` and sharding), or None.

    Attributes:
        buffers: float32 tensors shaped as ``params`` (saved in checkpoints as ``ema_raw``).
        weight: ``1 - prod(decay)`` so far (saved as the loop state's ``ema_weight``).
        eval_model: the copy whose trainable parameters :meth:`load_into_eval_model` overwrites.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        params: list[torch.Tensor],
        half_life_tokens: float,
        eval_model: torch.nn.Module | None = None,
    ):
        self.params = params
        self.half_life_tokens = half_life_tokens
        self.buffers = [torch.zeros_like(p, dtype=torch.float32) for p in params]
        self.weight = 0.0
        self.eval_model = copy.deepcopy(model) if eval_model is None else eval_model
        self._eval_params = [p for p in self.eval_model.parameters() if p.requires_grad]

    def update(self, tokens: int) -> None:
        """Fold in the current weights after a step that trained on ``tokens`` tokens."""
        decay = 0.5 ** (tokens / self.half_life_tokens)
        with torch.no_grad():
            bufs, params = _local(self.buffers), _local(self.params)
            torch._foreach_mul_(bufs, decay)  # pyright: ignore[reportPrivateImportUsage]  # torch's private foreach API
            torch._foreach_add_(bufs, [p.detach().float() for p in params], alpha=1 - decay)  # pyright: ignore[reportPrivateImportUsage]
        self.weight = decay * self.weight + (1 - decay)

    def load_into_eval_model(self) -> torch.nn.Module:
        """:attr:`eval_model` with the bias-corrected EMA weights ``buffer / weight`` (in its dtype)."""
        with torch.no_grad():
            for ep, e in zip(self._eval_params, self.buffers):
                ep.copy_((e / self.weight).to(ep.dtype))
        return self.eval_model

    def load_buffers(self, saved: list[torch.Tensor]) -> None:
        """Restore :attr:`buffers` from a checkpoint's ``ema_raw``, whole tensors (``weight`` is
        restored by the loop; a sharded buffer takes its own shard)."""
        from workloads.train.parallel import copy_full_into

        copy_full_into(self.buffers, saved)


def _local(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """This rank's shards of sharded tensors (DTensors, updated in place without DTensor dispatch); others as they are."""
    if tensors and hasattr(tensors[0], "to_local"):
        return [t.to_local() for t in tensors]  # pyright: ignore[reportAttributeAccessIssue]  # DTensors (checked above)
    return tensors
