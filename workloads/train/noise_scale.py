"""Gradient noise scale ``B_simple = tr(Sigma) / |G|^2``, estimated online at no extra compute.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", arXiv 1812.06162),
Appendix A.1, Eq. A.2: squared gradient norms at two batch sizes taken at the same parameters give
unbiased estimates of ``|G|^2`` and ``tr(Sigma)``. Here the small batch is one micro-batch of ``b``
sequences and the big batch is the whole step, ``K`` micro-batches over all workers
(methodology note section 2.3, layout 1 and 2 combined). The ratio is taken of separate
bias-corrected EMAs of the two estimates, as the paper does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["NoiseScaleEMA", "step_estimates"]


def step_estimates(
    mean_small_sq_norm: float, big_sq_norm: float, micro_batch_size: int, micro_batches: int
) -> tuple[float, float]:
    """Unbiased one-step estimates of ``|G|^2`` and ``tr(Sigma)``.

    With ``n_s`` the mean over the ``K`` micro-batch gradients of their squared norms and ``n_b``
    the squared norm of their mean (McCandlish et al. 2018, Eq. A.2, with ``B_small = b`` and
    ``B_big = b*K``)::

        |G|^2     ~ (K * n_b - n_s) / (K - 1)
        tr(Sigma) ~ b * K * (n_s - n_b) / (K - 1)

    Units: ``tr(Sigma)`` is per sequence, so ``B_simple`` comes out in sequences.

    Raises:
        ValueError: fewer than two micro-batches (the estimator is undefined).
    """
    K, b = micro_batches, micro_batch_size
    if K < 2:
        raise ValueError("the noise-scale estimator needs at least 2 micro-batches per step")
    g2 = (K * big_sq_norm - mean_small_sq_norm) / (K - 1)
    tr_sigma = b * K * (mean_small_sq_norm - big_sq_norm) / (K - 1)
    return g2, tr_sigma


@dataclass
class NoiseScaleEMA:
    """Bias-corrected EMAs of the ``|G|^2`` and ``tr(Sigma)`` estimates; ``b_simple`` is their ratio.

    Non-finite step estimates are skipped (as every public implementation does).
    """

    decay: float = 0.95
    g2_ema: float = 0.0
    tr_sigma_ema: float = 0.0
    weight: float = 0.0  # 1 - decay**n, for bias correction

    def update(self, g2: float, tr_sigma: float) -> None:
        if not (math.isfinite(g2) and math.isfinite(tr_sigma)):
            return
        d = self.decay
        self.g2_ema = d * self.g2_ema + (1 - d) * g2
        self.tr_sigma_ema = d * self.tr_sigma_ema + (1 - d) * tr_sigma
        self.weight = d * self.weight + (1 - d)

    @property
    def grad_sq_norm(self) -> float | None:
        return self.g2_ema / self.weight if self.weight else None

    @property
    def trace_sigma(self) -> float | None:
        return self.tr_sigma_ema / self.weight if self.weight else None

    @property
    def b_simple(self) -> float | None:
        """``EMA(tr Sigma) / EMA(|G|^2)`` in sequences; None before the first update or if ``|G|^2 <= 0``."""
        g2, tr = self.grad_sq_norm, self.trace_sigma
        if g2 is None or tr is None or g2 <= 0:
            return None
        return tr / g2

    def state_dict(self) -> dict:
        return {"decay": self.decay, "g2_ema": self.g2_ema, "tr_sigma_ema": self.tr_sigma_ema, "weight": self.weight}

    def load_state_dict(self, state: dict) -> None:
        self.decay, self.g2_ema, self.tr_sigma_ema, self.weight = (
            state["decay"],
            state["g2_ema"],
            state["tr_sigma_ema"],
            state["weight"],
        )
