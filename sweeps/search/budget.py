"""Sweep-wide budgets: plan the trials to fit ``budget.sweep_flops``, and stop the sweep when it is spent.

Two pieces, used by the driver:

* :func:`plan_trials` (pure): how many trials per batch size (and seed) fit the FLOP budget, given
  the FLOPs per token of the model. Every batch size keeps at least one trial per seed (the analysis
  needs every batch size), so a budget that cannot pay for that is refused up front.
* :class:`SweepBudgetStopper` (a Ray Tune ``Stopper``): sums the training FLOPs every trial has
  reported (``flops``, the latest per trial, pruned and stopped trials included) and stops the whole
  experiment once the sum reaches the budget. The driver then analyses what finished. The
  wall-clock budget is Tune's own ``TuneConfig(time_budget_s=...)``.

FLOPs here are training FLOPs (``flops_per_token * tokens``, the ``flops`` every milestone reports);
evaluation FLOPs (``flops_measurement``) are not charged to the budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ray.tune import Stopper

from sweeps.errors import InvalidInput
from sweeps.pruning.rungs import rung_fractions
from sweeps.spec import PruningSpec, SweepSpec

__all__ = [
    "SweepBudgetStopper",
    "TrialPlan",
    "apply_plan",
    "expected_trial_fraction",
    "paused_group_cost",
    "plan_trials",
]


def expected_trial_fraction(pruning: PruningSpec) -> float:
    """Expected share of its budget a prunable trial trains under successive halving.

    With rungs at fractions ``f_0 < ... < f_{K-1}`` of the budget (``f_K = 1``) and the top
    ``1/r`` continuing at each rung, a ``r**-k`` share of trials trains from ``f_{k-1}`` to ``f_k``:
    ``f_0 + sum_k (f_{k+1} - f_k) / r**(k+1)`` (the synchronous successive-halving cost of Jamieson
    and Talwalkar 2016, arXiv 1502.07943, per trial). 1.0 when pruning is off. An estimate for
    planning: the stopper enforces the budget whatever happens.

    >>> expected_trial_fraction(PruningSpec(enabled=True, grace_fraction=0.25, reduction_factor=2.0))
    0.5
    """
    if not pruning.enabled:
        return 1.0
    f = rung_fractions(pruning.grace_fraction, pruning.reduction_factor) + [1.0]
    r = pruning.reduction_factor
    return f[0] + sum((f[k + 1] - f[k]) / r ** (k + 1) for k in range(len(f) - 1))


def paused_group_cost(pruning: PruningSpec, n_trials: int) -> float:
    """Trial budgets that ``n_trials`` trials of one batch size train under ``pruning.mode: pause``.

    Every rung waits for the whole batch size, so the cost is fixed by the counts: with rungs at
    fractions ``f_0 < ... < f_{K-1}`` (``f_{-1} = 0``, ``f_K = 1``), ``n_0 = n_trials`` trials train to
    ``f_0`` and ``n_{k+1} = ceil(n_k / r)`` of them (all while ``n_k < min_trials_per_rung``) from ``f_k``
    to ``f_{k+1}``: ``sum_k n_k (f_k - f_{k-1})`` (synchronous successive halving, Jamieson & Talwalkar
    2016, arXiv 1502.07943). With a ``margin`` the survivors are not known in advance: counted as
    ``ceil(n_k / r)``. A diverged trial ends sooner, so this is an upper estimate.

    >>> paused_group_cost(PruningSpec(enabled=True, grace_fraction=0.25, reduction_factor=2.0), 4)
    2.0
    """
    if not pruning.enabled:
        return float(n_trials)
    f = [0.0] + rung_fractions(pruning.grace_fraction, pruning.reduction_factor) + [1.0]
    n, total = n_trials, 0.0
    for k in range(1, len(f)):
        total += n * (f[k] - f[k - 1])
        if n >= pruning.min_trials_per_rung:
            n = max(1, math.ceil(n / pruning.reduction_factor - 1e-9))
    return total


@dataclass(frozen=True, kw_only=True)
class TrialPlan:
    """What fits the sweep's FLOP budget.

    Attributes:
        trials_per_batch_size: planned Optuna suggestions per batch size (each run once per seed).
        n_trials: planned Tune trials (batch sizes x trials per batch size x seeds).
        trial_flops: training FLOPs of one full trial (``flops_per_token * budget_tokens``).
        planned_flops: expected FLOPs of the plan (the first trial of each batch size and seed in
            full, the others at :func:`expected_trial_fraction`); None without a FLOP budget.
        sweep_flops: the budget (None: unlimited).
        reduced: True if the spec asked for more trials than fit.
    """

    trials_per_batch_size: int
    n_trials: int
    trial_flops: float | None
    planned_flops: float | None
    sweep_flops: float | None
    reduced: bool


def plan_trials(spec: SweepSpec, flops_per_token: float | None) -> TrialPlan:
    """The largest number of trials per batch size (at most the spec's) whose expected FLOPs fit.

    ``pruning.mode: stop``: a cell (one batch size, one seed) with ``k`` trials is expected to cost
    ``trial_flops * (1 + (k - 1) * expected_trial_fraction(spec.pruning))``: its first trial always
    trains the whole budget (nothing to compare it with), the others may be pruned. ``pause``: a batch
    size's ``k * seeds`` trials cost ``trial_flops * paused_group_cost(...)`` (known in advance).
    Without pruning every trial costs ``trial_flops``.

    Args:
        spec: the sweep (``budget.sweep_flops``, ``budget_tokens``, batch sizes, seeds, pruning).
        flops_per_token: training FLOPs per token of the model; None when unknown before training
            (then nothing is planned and only the stopper enforces the budget).

    Raises:
        InvalidInput: the budget cannot pay for one full trial per batch size and seed.
    """
    s = spec.search
    k_spec = s.trials_per_batch_size
    cells = len(s.batch_sizes_sequences) * len(spec.seeds)
    budget = spec.budget.sweep_flops
    trial_flops = flops_per_token * spec.budget_tokens if flops_per_token else None
    if budget is None or trial_flops is None:
        return TrialPlan(
            trials_per_batch_size=k_spec,
            n_trials=cells * k_spec,
            trial_flops=trial_flops,
            planned_flops=None,
            sweep_flops=budget,
            reduced=False,
        )
    frac = expected_trial_fraction(spec.pruning)
    paused = spec.pruning.enabled and spec.pruning.mode == "pause"

    def cost(k: int) -> float:
        if paused:  # the rungs compare a batch size's trials across seeds: one group per batch size
            return len(s.batch_sizes_sequences) * trial_flops * paused_group_cost(spec.pruning, k * len(spec.seeds))
        return cells * trial_flops * (1 + (k - 1) * frac)

    if cost(1) > budget * (1 + 1e-9):
        raise InvalidInput(
            f"budget.sweep_flops ({budget:.3g}) cannot train one trial per batch size and seed: that needs "
            f"{cost(1):.3g} FLOPs ({cells} x {trial_flops:.3g}); raise the budget, or lower budget_tokens, "
            f"the batch sizes or the seeds"
        )
    if paused:
        k = max(k for k in range(1, k_spec + 1) if k == 1 or cost(k) <= budget * (1 + 1e-9))
    else:
        k = 1 + int(math.floor((budget / (cells * trial_flops) - 1) / frac + 1e-9))
    k = min(k, k_spec)
    return TrialPlan(
        trials_per_batch_size=k,
        n_trials=cells * k,
        trial_flops=trial_flops,
        planned_flops=cost(k),
        sweep_flops=budget,
        reduced=k < k_spec,
    )


def apply_plan(spec: SweepSpec, plan: TrialPlan) -> SweepSpec:
    """The spec derived from ``spec`` with the planned trials per batch size (``spec`` if unchanged)."""
    if plan.trials_per_batch_size == spec.search.trials_per_batch_size:
        return spec
    search = spec.search.model_copy(update={"trials_per_batch_size": plan.trials_per_batch_size})
    return spec.model_copy(update={"search": search})


class SweepBudgetStopper(Stopper):
    """Stops the whole Tune experiment once the trials' training FLOPs reach ``sweep_flops``.

    Args:
        sweep_flops: the budget in training FLOPs.
        spent_flops: FLOPs already spent before this run (a resumed sweep): a mapping of trial id to
            that trial's last reported (cumulative) ``flops``, or one number not tied to a trial. A
            resumed trial sends its reports again; by trial id they replace its past FLOPs instead of
            adding to them.

    Never stops a single trial (``__call__`` is False): pruning is the scheduler's business, so a
    trial stopped here is STOPPED, not PRUNED. ``exhausted`` tells the driver why the sweep ended.

    Raises:
        ValueError: ``sweep_flops`` is not positive.
    """

    def __init__(self, sweep_flops: float, spent_flops: float | dict[str, float] = 0.0):
        if not sweep_flops > 0:
            raise ValueError(f"sweep_flops must be > 0, got {sweep_flops}")
        self.sweep_flops = float(sweep_flops)
        self.base_flops = 0.0
        self.latest: dict[str, float] = {}
        self.add_spent(spent_flops)

    def add_spent(self, spent_flops: float | dict[str, float]) -> None:
        """Count FLOPs spent before this run (see ``spent_flops`` above)."""
        if isinstance(spent_flops, dict):
            for trial_id, f in spent_flops.items():
                self.latest[trial_id] = max(self.latest.get(trial_id, 0.0), float(f))
        else:
            self.base_flops += float(spent_flops)

    @property
    def spent_flops(self) -> float:
        return self.base_flops + sum(self.latest.values())

    @property
    def exhausted(self) -> bool:
        return self.spent_flops >= self.sweep_flops

    def __call__(self, trial_id: str, result: dict) -> bool:
        f = result.get("flops")
        if isinstance(f, (int, float)) and math.isfinite(f):
            self.latest[trial_id] = max(self.latest.get(trial_id, 0.0), float(f))
        return False

    def stop_all(self) -> bool:
        return self.exhausted
