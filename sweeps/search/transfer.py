"""Learning-rate transfer across batch sizes (``search.strategy: transfer``): where each batch
size's trials go.

Batch sizes run outward from the swept batch size nearest ``base_batch_size_sequences``. The first one
centres its trials on the spec's starting LR (``base_lr`` scaled by the first LR rule, at the geometric
middle of ``lr_multiplier``). Each next batch size ``B`` waits for its *anchor*, the neighbour one step
nearer the start, to finish, then centres on the anchor's best LR scaled by ``(B / anchor)^alpha``:
``alpha`` is the exponent fitted over the best LRs of the batch sizes finished so far
(:func:`sweeps.analysis.lr_scaling.lr_exponent_fit`, clipped to [0, 1]) once three have finished, and the
square-root rule's 0.5 before (Malladi et al. 2022, the Adam SDE). A batch size's ``k`` trials sit an
octave apart around its centre (offsets ``i - (k - 1) / 2`` octaves, at most 2 octaves either side):
two trials are half an octave either side; one trial runs at the centre, so with one trial per batch
size nothing is searched (the square-root rule from the starting LR). beta2 is not searched: every batch size carries the first
one's (the geometric middle of ``beta2.half_life_tokens``, or the first of ``beta2.values``), as a token
half-life where the spec gives one.

The centre lies on the LR lattice (:mod:`sweeps.search.lattice`) and never more than an octave outside the best LRs
measured so far (:data:`MAX_EXTRAPOLATION_OCTAVES`). A batch size's best LR, the one carried outward, is its
fastest at the target losses the fit uses (:func:`fastest_to_targets`; before they are declared, a band of that
batch size's early losses, :func:`provisional_targets`).

The centre (and alpha) is fixed when a batch size is first handed out, from the batch sizes finished
by then: with as many concurrent trials as trials per batch size (the examples) that set does not
depend on timing; with more slots it can. On real training (``benchmarks/real_coverage.py``, docs/benchmarks.md,
"Real-training coverage") this placement with ``search.precision``'s bracket rule covers the reference where the
earlier one did not.

Pure functions; :class:`sweeps.search.strategies.TransferStrategy` keeps the state and places the trials.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sweeps.analysis.lr_scaling import lr_exponent_fit
from sweeps.analysis.targets import tokens_to_target
from sweeps.search.lattice import snap_lr
from sweeps.spec import SearchSpec
from workloads.api import scaled_lr

__all__ = [
    "MAX_EXTRAPOLATION_OCTAVES",
    "MAX_OFFSET_OCTAVES",
    "MAX_PROBE_OFFSET_OCTAVES",
    "PRIOR_ALPHA",
    "anchor_of",
    "fastest_to_targets",
    "lr_offsets_octaves",
    "provisional_targets",
    "start_centre",
    "transfer_centre",
    "transfer_order",
]

#: the farthest a transferred centre may lie outside the range of the best LRs measured so far (octaves)
MAX_EXTRAPOLATION_OCTAVES = 1.0

#: the farthest a ``search.precision`` LR probe may sit from its batch size's centre (octaves, either side)
MAX_PROBE_OFFSET_OCTAVES = 6.0

#: the LR exponent used until three batch sizes have finished: the square-root rule
PRIOR_ALPHA = 0.5


def transfer_order(batch_sizes: list[int], base_batch_size: int) -> list[int]:
    """The batch sizes outward from the one nearest ``base_batch_size`` (in log distance; ties: the smaller
    first), alternating sides by distance: e.g. ``[4, ..., 256]`` from 16 gives ``[16, 8, 32, 4, 64, 128, 256]``."""
    start = min(batch_sizes, key=lambda b: (abs(math.log(b / base_batch_size)), b))
    return sorted(batch_sizes, key=lambda b: (abs(math.log(b / start)), b))


def anchor_of(batch_size: int, order: list[int]) -> int | None:
    """The batch size whose best LR ``batch_size`` transfers from: the next one towards ``order[0]`` on its
    side (None for ``order[0]`` itself)."""
    start = order[0]
    if batch_size == start:
        return None
    side = [
        b
        for b in order
        if (b < batch_size if batch_size > start else b > batch_size)
        and (b >= start if batch_size > start else b <= start)
    ]
    return min(side, key=lambda b: abs(math.log(batch_size / b)))


#: the widest spread of a batch size's trials around its centre, in octaves (either side)
MAX_OFFSET_OCTAVES = 2.0


def lr_offsets_octaves(k: int) -> list[float]:
    """The ``k`` trials' LR offsets from the centre, in octaves: an octave apart (``i - (k - 1) / 2``),
    closer when that would reach past :data:`MAX_OFFSET_OCTAVES` (so 9 or more trials span +-2 octaves)."""
    if k == 1:
        return [0.0]
    step = min(1.0, 2 * MAX_OFFSET_OCTAVES / (k - 1))
    return [(i - (k - 1) / 2) * step for i in range(k)]


def transfer_centre(batch_size: int, anchor: int, best_lrs: dict[int, float]) -> tuple[float, float]:
    """The centre LR of ``batch_size``'s trials: ``best_lrs[anchor] (batch_size / anchor)^alpha``.

    Args:
        best_lrs: the best LR of every finished batch size (``anchor`` among them).

    Returns:
        ``(centre, alpha)``: alpha is fitted over ``best_lrs`` with 3 or more batch sizes (clipped to
        [0, 1]), else :data:`PRIOR_ALPHA`. The centre never lies more than :data:`MAX_EXTRAPOLATION_OCTAVES`
        outside the range of ``best_lrs`` (an exponent fitted on a few noisy points, carried across several
        doublings, must not walk the search off the measured LRs; it is clamped there).
    """
    fit = lr_exponent_fit(list(best_lrs), list(best_lrs.values())) if len(best_lrs) >= 3 else None
    alpha = min(max(fit["alpha"], 0.0), 1.0) if fit else PRIOR_ALPHA
    centre = best_lrs[anchor] * (batch_size / anchor) ** alpha
    room = 2.0**MAX_EXTRAPOLATION_OCTAVES
    return min(max(centre, min(best_lrs.values()) / room), max(best_lrs.values()) * room), alpha


def start_centre(
    search: SearchSpec, batch_size: int, anchor: int | None, best_lrs: dict[int, float]
) -> tuple[float, float | None]:
    """Where a batch size's trials are centred when it starts: the first batch size (no ``anchor``) at the spec's
    starting LR (``base_lr`` scaled by the first LR rule at the geometric middle of ``lr_multiplier``), any other
    at :func:`transfer_centre`; on the LR lattice (``search.lr_lattice_octaves``, so that its trials' offsets land
    on lattice points) unless that is null.

    Returns:
        ``(centre, alpha)``; alpha None for the first batch size.
    """
    if anchor is None:
        lo, hi = search.lr_multiplier
        centre = scaled_lr(
            search.base_lr, search.base_batch_size_sequences, batch_size, search.lr_rules[0], math.sqrt(lo * hi)
        )
        alpha = None
    else:
        centre, alpha = transfer_centre(batch_size, anchor, best_lrs)
    step = getattr(search, "lr_lattice_octaves", None)
    return (snap_lr(centre, search.base_lr, step) if step else centre), alpha


def provisional_targets(curves: Sequence[tuple[Sequence[float], Sequence[float]]], n_targets: int = 4) -> list[float]:
    """Target losses to rank a batch size's LRs by before the sweep's targets are declared (its first wave),
    from that batch size's own curves: a band like the one the fit's target rule declares (several targets
    that most trials reach, spaced up towards the start of training), here from the highest loss every finite
    curve shows at its middle milestone (a loss every trial reaches early) up to halfway to the lowest first
    milestone's loss, ``n_targets`` evenly spaced, decreasing. The fit's targets lie well above the lowest loss
    a small batch size reaches, and the fastest LR moves with the target (higher losses favour higher LRs), so
    ranking by the lowest common loss carried LRs too low outward (docs/benchmarks.md, "Real-training
    coverage"). Empty when no curve is finite."""
    finite = [c for c in curves if c[1] and all(math.isfinite(x) for x in c[1])]
    if not finite:
        return []
    low = max(losses[(len(losses) - 1) // 2] for _, losses in finite)
    first = min(losses[0] for _, losses in finite)
    high = low + 0.5 * (first - low)
    if n_targets <= 1 or high <= low:
        return [low]
    return [high - i * (high - low) / (n_targets - 1) for i in range(n_targets)]


def fastest_to_targets(
    groups: Sequence[Sequence[tuple[Sequence[float], Sequence[float]]]], targets: list[float]
) -> int | None:
    """Which of a batch size's groups (one LR each; a group's trials are its seeds) is best at the target losses
    the fit uses: the lowest mean over ``targets`` of the group's mean log tokens to each target
    (:func:`sweeps.analysis.targets.tokens_to_target`, interpolated in log tokens); a trial that does not reach
    a target counts ``log`` of its last milestone's tokens plus 1 there (slower than any that does, ordered by how
    long it trained), a diverged one (a non-finite loss) likewise at its last finite milestone. Ties go to the
    lower mean final loss.

    Args:
        groups: per group, its trials' ``(tokens, val_loss)`` milestone curves (completed trials only).
        targets: the target losses (nats): the sweep's declared ones, or :func:`provisional_targets`.

    Returns:
        The index of the best group, or None without targets or when no group has a trial with a curve.
    """
    if not targets:
        return None
    best, key = None, None
    for i, g in enumerate(groups):
        curves = [c for c in g if c[0] and c[1]]
        if not curves or len(curves) != len(g):
            continue
        scores = []
        for tokens, losses in curves:
            for target in targets:
                tok = tokens_to_target(tokens, losses, target)
                if tok is None:
                    seen = [t for t, l in zip(tokens, losses) if math.isfinite(l)]
                    tok = math.e * (seen[-1] if seen else tokens[0])
                scores.append(math.log(tok))
        finals = [c[1][-1] if math.isfinite(c[1][-1]) else math.inf for c in curves]
        k = (sum(scores) / len(scores), sum(finals) / len(finals))
        if key is None or k < key:
            best, key = i, k
    return best
