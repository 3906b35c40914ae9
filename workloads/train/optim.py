"""The trial's optimizer (``optimizer.name`` of the spec, :class:`workloads.config.OptimizerConfig`).

:func:`build_optimizer` makes one of four ``torch.optim.Optimizer`` s over the trainable
parameters; :func:`state_bytes_per_param` measures what its state holds. The LR (warmup, the LR
rule, the multiplier) is set on every param group at every step by :class:`workloads.train.step.Stepper`
for each optimizer alike; beta2 only where the group has ``betas`` (the Adam family).

==============  ===============================================  ==========================================
name            class                                            hyperparameters read
==============  ===============================================  ==========================================
``adamw``       ``torch.optim.AdamW`` (fused on CUDA, foreach    lr, beta1, beta2 (or its half-life),
                elsewhere: the loop's construction, unchanged)   eps, weight_decay
``adafactor``   ``torch.optim.Adafactor`` (Shazeer & Stern       lr (relative step size cap: the update is
                2018; factored second moment of 2-D weights,     ``lr * max(1e-3, RMS(param))`` times the
                no first moment)                                 normalised gradient), weight_decay
``sgd_momentum`` ``torch.optim.SGD(momentum=beta1,               lr, beta1 (the momentum), weight_decay
                nesterov=False)``                                (coupled: added to the gradient)
``adamw_8bit``  ``bitsandbytes.optim.AdamW8bit`` (Dettmers et    lr, beta1, beta2, eps, weight_decay
                al. 2022, ICLR, "8-bit Optimizers via Block-
                wise Quantization": uint8 moments in blocks of
                256 with a float32 scale each; tensors under
                4,096 elements keep float32 moments; CUDA, and
                CPU from bitsandbytes 0.50)
==============  ===============================================  ==========================================

Adafactor's second-moment decay is ``1 - t^beta2_decay`` (torch's default ``beta2_decay=-0.8``),
not a constant beta2, and SGD has no second moment: for both, ``beta2`` and its half-life are not
read (the spec refuses to *search* them, ``sweeps.spec.sweep``). Neither reads ``eps`` (Adafactor
keeps torch's ``eps=(None, 1e-3)``) and Adafactor has no ``beta1``.
"""

from __future__ import annotations

import logging

import torch
from packaging.version import Version

from workloads.config import OptimizerConfig
from workloads.sections import reads_beta2  # re-exported: the one definition is beside the optimizer names

__all__ = ["BITSANDBYTES_HINT", "build_optimizer", "reads_beta2", "state_bytes_per_param"]

log = logging.getLogger(__name__)

#: how to get the package of ``adamw_8bit`` (a dependency of critbatch; missing only from a bare install)
BITSANDBYTES_HINT = "pip install 'bitsandbytes>=0.50' (a dependency of critbatch)"
#: the first bitsandbytes release with a CPU kernel for its block-wise 8-bit optimizer update
#: (``bitsandbytes::optimizer_update_8bit_blockwise`` registered for ``cpu``; 0.49 has none)
BITSANDBYTES_CPU_MIN = "0.50"


def build_optimizer(params: list[torch.Tensor], cfg: OptimizerConfig, device: torch.device) -> torch.optim.Optimizer:
    """The optimizer ``cfg.name`` over ``params`` (one param group), at ``cfg.lr`` (see the module's table).

    Args:
        params: the trainable parameters (DTensors under fsdp: ``adamw`` and ``sgd_momentum`` only).
        cfg: the trial's optimizer section.
        device: where ``params`` live (``adamw``: fused on CUDA, foreach elsewhere).

    Raises:
        ValueError: an unknown ``cfg.name``; ``adamw_8bit`` on a device other than CUDA or CPU, or on CPU
            with a bitsandbytes older than 0.50 (no CPU kernel for the 8-bit update).
        ImportError: ``adamw_8bit`` without ``bitsandbytes`` installed.
    """
    name = cfg.name
    if not reads_beta2(name):
        log.info(
            "optimizer %s has no constant beta2: beta2=%g (half-life %g tokens) is not read%s",
            name,
            cfg.beta2,
            cfg.beta2_half_life_tokens,
            "; nor is eps" if name == "sgd_momentum" else "; nor are beta1 and eps",
        )
    if name == "adamw":
        from workloads.train.parallel import adamw_impl

        return torch.optim.AdamW(
            params,
            lr=cfg.lr,
            betas=(cfg.beta1, cfg.beta2),
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            **adamw_impl(device),
        )
    if name == "sgd_momentum":
        return torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.beta1, nesterov=False, weight_decay=cfg.weight_decay, foreach=True
        )
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)
    if name == "adamw_8bit":
        bnb = _bitsandbytes(device)
        return bnb.optim.AdamW8bit(  # pyright: ignore[reportPrivateImportUsage]  # bitsandbytes does not re-export it
            params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay
        )
    raise ValueError(f"unknown optimizer {name!r}")


def _bitsandbytes(device: torch.device):
    """The ``bitsandbytes`` module, checked to have an 8-bit optimizer kernel for ``device``.

    Raises:
        ImportError: bitsandbytes is not installed.
        ValueError: ``device`` is neither CUDA nor CPU, or it is CPU and bitsandbytes predates 0.50.
    """
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"optimizer adamw_8bit (bitsandbytes AdamW8bit) runs on CUDA or CPU, not {device}")
    # bitsandbytes' CPU backend logs a warning at import on some CPUs about an optional 4-bit matmul
    # kernel (the `kernels` package); the 8-bit optimizer does not use it
    quiet = logging.getLogger("bitsandbytes.backends.cpu.ops")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        import bitsandbytes as bnb
    except ImportError as e:
        raise ImportError(f"optimizer adamw_8bit needs the bitsandbytes package: {BITSANDBYTES_HINT}") from e
    finally:
        quiet.setLevel(level)
    if device.type == "cpu" and Version(bnb.__version__) < Version(BITSANDBYTES_CPU_MIN):
        raise ValueError(
            f"optimizer adamw_8bit on CPU needs bitsandbytes >= 0.50 (its CPU kernel for the 8-bit "
            f"update), found {bnb.__version__}: {BITSANDBYTES_HINT}"
        )
    return bnb


def state_bytes_per_param(opt: torch.optim.Optimizer, n_params: int) -> float:
    """Bytes of optimizer state per trainable parameter: ``sum(numel * element_size)`` over every
    tensor in ``opt.state`` (step counters and quantisation maps included), over ``n_params``.

    Measured on this rank's state: under ddp every rank holds the whole state; under fsdp a
    DTensor counts its local shard, and the caller sums over ranks (and passes the global count).

    Args:
        opt: an optimizer after its first step (before it the state is empty: 0.0).
        n_params: trainable parameters (elements) the state is for.

    Returns:
        bytes per parameter (float; e.g. ~8 for AdamW in float32, ~4 for SGD momentum).
    """
    from torch.distributed.tensor import DTensor

    total = 0
    for s in opt.state.values():
        for v in s.values():
            if isinstance(v, DTensor):
                v = v.to_local()
            if isinstance(v, torch.Tensor):
                total += v.numel() * v.element_size()
    return total / max(n_params, 1)
