"""Published batch-size laws, evaluated at a budget as a cross-check of a study's own law, never as its input.

Each law gives either an absolute batch size (Step Law's constants) or only an exponent, which is then anchored
at the study's largest member (its measured critical batch size at its budget), so that the comparison is of the
growth from that budget on, not of the level.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PUBLISHED_LAWS", "PublishedLaw", "published_predictions"]


@dataclass(frozen=True)
class PublishedLaw:
    """One published law ``B = coefficient * D^exponent``.

    Attributes:
        name: short name; ``source``: paper and where in it.
        quantity: ``b_crit`` or ``b_opt`` (the best batch size at a fixed budget: not the same quantity).
        exponent: the exponent in D (training tokens).
        coefficient_tokens: the coefficient when the law is absolute and gives tokens per batch; None when only
            the exponent is published (the law is then anchored at a measured member).
    """

    name: str
    source: str
    quantity: str
    exponent: float
    coefficient_tokens: float | None = None


#: the laws the study is compared with (exponents and constants as the papers state them)
PUBLISHED_LAWS = (
    PublishedLaw("Power Lines b_crit", "Bergsma et al. 2025, arXiv 2505.13738: B_crit ~ D_min^0.5", "b_crit", 0.5),
    PublishedLaw("Power Lines b_opt", "Bergsma et al. 2025, arXiv 2505.13738: B_opt ~ D^0.383", "b_opt", 0.383),
    PublishedLaw(
        "Step Law b_opt",
        "Li et al. 2025, arXiv 2503.04715: B_opt = 0.58 D^0.571 (tokens)",
        "b_opt",
        0.571,
        coefficient_tokens=0.58,
    ),
    PublishedLaw(
        "Zhang et al. 2024",
        "Zhang et al. 2024, arXiv 2410.21676: CBS grows with D; the authors' notebook "
        "fits about D^0.47 over a Chinchilla series",
        "b_crit",
        0.47,
    ),
)


def published_predictions(
    tokens: float, anchor_tokens: float, anchor_b_crit: float, tokens_per_sequence: float | None
) -> list[dict]:
    """Each :data:`PUBLISHED_LAWS` law at budget ``tokens`` (sequences where it can say).

    Args:
        tokens: the budget to predict at (tokens).
        anchor_tokens, anchor_b_crit: the member an exponent-only law is anchored at (tokens; sequences).
        tokens_per_sequence: to turn an absolute law's tokens into sequences (None: tokens only).

    Returns:
        one dict per law: ``name``, ``source``, ``quantity``, ``exponent``, ``anchored`` (bool), ``sequences``
        (None when an absolute law cannot be converted), ``tokens`` (None for an anchored law without
        ``tokens_per_sequence``).
    """
    out = []
    for law in PUBLISHED_LAWS:
        if law.coefficient_tokens is not None:
            batch_tokens = law.coefficient_tokens * tokens**law.exponent
            seqs = batch_tokens / tokens_per_sequence if tokens_per_sequence else None
        else:
            seqs = anchor_b_crit * (tokens / anchor_tokens) ** law.exponent
            batch_tokens = seqs * tokens_per_sequence if tokens_per_sequence else None
        out.append(
            {
                "name": law.name,
                "source": law.source,
                "quantity": law.quantity,
                "exponent": law.exponent,
                "anchored": law.coefficient_tokens is None,
                "sequences": seqs,
                "tokens": batch_tokens,
            }
        )
    return out
