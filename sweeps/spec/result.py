"""The record of a sweep's answer: :class:`CbsResult`, the content of ``OUT/cbs.json``.

The analysis (:func:`sweeps.analysis.analyze_trials`) builds it, the end of a sweep
(:mod:`sweeps.run.finish`) adds the sweep-level fields through :func:`sweeps.analysis.with_sweep_fields`, and
every reader (the report, ``critbatch plan``, ``critbatch compare``, the CLI, the REST service) reads its
attributes. Plain data, like the rest of :mod:`sweeps.spec`: the REST service imports it.

The file is the model's :meth:`CbsResult.to_json_dict` written as indented JSON. A field the file did not
have stays absent from the dump (not ``null``): files from earlier versions, with fewer keys, load and
re-serialize as they were read. Keys the model does not name are kept (``extra="allow"``) and dumped after
the named ones. Field order is the file's key order: the headline first. Units: batch sizes in sequences
unless the name says ``_tokens``; steps are optimizer steps; losses in nats; intervals are ``[lo, hi]``
with ``hi`` None when unbounded; a value the analysis could not give is None.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

__all__ = [
    "ArmAtTarget",
    "ArmTargetFit",
    "BatchRecord",
    "BestCheckpoint",
    "CbsResult",
    "CensoredPoint",
    "ComparisonArm",
    "ComparisonAtTarget",
    "ComparisonPoint",
    "ComparisonResult",
    "Interval",
    "LocalCbsPoint",
    "LrAtBatch",
    "MlflowRuns",
    "NoiseScaleSeries",
    "TargetFit",
    "TargetPoint",
    "TrialsByStatus",
    "is_comparison_record",
]

#: ``[lo, hi]``: ``hi`` None when the interval is unbounded above (``lo`` None only where a record says so)
Interval = list[float | None]

#: a count or amount read through from the trials' records, which hold it as an int or a float: the file
#: writes it as it was read (``64`` and ``64.0`` are different bytes)
Amount = int | float


class _Record(BaseModel):
    """A part of ``cbs.json``: keeps the keys it does not name, dumps only the keys it was given."""

    model_config = ConfigDict(extra="allow", frozen=True)

    @model_serializer(mode="wrap")
    def _given_keys_only(self, handler: SerializerFunctionWrapHandler) -> Any:
        # every dump (cbs.json, the REST response) holds the keys the record was given, absent ones absent
        out = handler(self)
        given = self.model_fields_set | set(self.model_extra or {})
        return {k: v for k, v in out.items() if k in given}

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON object this record is written as: its given keys in field order, then the unnamed ones."""
        return self.model_dump(mode="python")

    # read access by JSON key, for code that handles cbs.json as parsed JSON (``cbs["b_crit"]``): a key the
    # record was not given reads as absent, as it would in the file
    def __getitem__(self, key: str) -> Any:
        if key not in self:
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return key in self.model_fields_set or key in (self.model_extra or {})

    def get(self, key: str, default: Any = None) -> Any:
        """The value of JSON key ``key``, or ``default`` if the record does not have it."""
        return self[key] if key in self else default


class TrialsByStatus(_Record):
    """How many of the sweep's trials ended in each status."""

    COMPLETED: int = 0
    DIVERGED: int = 0
    FAILED: int = 0
    PRUNED: int = 0
    STOPPED: int = 0


class TargetPoint(_Record):
    """One (batch size, seed) cell's steps to a target: the minimum over its trials
    (:func:`sweeps.analysis.steps_to_target_points`). ``upper_bound``: True where the seed was already below the
    target at its first milestone (the steps are then at most this)."""

    batch_size_sequences: int
    seed: int | None = None
    tokens_to_target: float | None = None
    steps_to_target: float
    trial_id: str | None = None
    group_id: str | None = None
    upper_bound: bool | None = None


class CensoredPoint(_Record):
    """A (batch size, seed) cell with trials but no crossing of the target: it needs more than
    ``steps_lower_bound`` steps (:func:`sweeps.analysis.censored_points`); ``fit_steps`` is what the fit made
    without it gives it and ``fit_consistent`` whether that is more."""

    batch_size_sequences: int
    seed: int | None = None
    tokens_lower_bound: float | None = None
    steps_lower_bound: float | None = None
    trial_id: str | None = None
    fit_steps: float | None = None
    fit_consistent: bool | None = None


class TargetFit(_Record):
    """One target loss's fit of steps to target against batch size (:func:`sweeps.analysis.analyze_points`):
    ``b_crit = E_min / S_min`` of ``S(B) = S_min + E_min / B`` (McCandlish et al. 2018, arXiv 1812.06162,
    Eqs. 2.11-2.12), its interval and status, with the points it was fitted on."""

    target_loss: float | None = None
    b_crit: float | None = None
    b_crit_ci: Interval | None = None
    #: "< B" or "> B" when the knee lies outside the fitted batch sizes
    b_crit_bound: str | None = None
    cbs_20: float | None = None
    cbs_20_ci: Interval | None = None
    s_min: float | None = None
    s_min_ci: Interval | None = None
    e_min: float | None = None
    e_min_ci: Interval | None = None
    status: str | None = None
    n_points: int | None = None
    n_batch_sizes: int | None = None
    fitted_batch_sizes: list[float] | None = None
    censored_in_fit: list[float] | None = None
    upper_bounded_in_fit: list[float] | None = None
    # each seed's own fit, as sweeps.analysis.seed_effects reports it (its keys follow the fit that made it)
    seed_fits: list[dict[str, Any]] | None = None
    between_seed_sd_log: float | None = None
    b_crit_ci_unwidened: Interval | None = None
    #: the gain in log steps an open LR bracket could give, by batch size (the JSON key is the batch size)
    open_bracket_gains: dict[str, float] | None = None
    rms_log_residual: float | None = None
    message: str | None = None
    points: list[TargetPoint] | None = None
    excluded_batch_sizes: list[int] | None = None
    censored_points: list[CensoredPoint] | None = None


class BatchRecord(_Record):
    """One batch size's steps and tokens to the primary target, its best configuration at the budget and the
    compute it used (``cbs.json``'s ``per_batch``). Configurations are the trial's hyperparameters, whose
    names follow the sweep's search space (hence a free-form mapping)."""

    batch_size_sequences: int
    batch_size_tokens: float | None = None
    tokens_to_target: float | None = None
    steps_to_target: float | None = None
    flops_to_target: float | None = None
    trial_ids_to_target: list[str] | None = None
    config_to_target: dict[str, Any] | None = None
    best_config_at_budget: dict[str, Any] | None = None
    trial_ids_at_budget: list[str] | None = None
    seeds: list[int] | None = None
    loss_at_budget: float | None = None
    budget_tokens: Amount | None = None
    tokens_trained: Amount | None = None
    trials: int | None = None


class NoiseScaleSeries(_Record):
    """The simple gradient noise scale ``B_simple`` (sequences; McCandlish et al. 2018, Eq. 2.9) of a batch
    size's best-at-budget trial against tokens trained."""

    batch_size_sequences: int
    tokens: list[Amount | None] | None = None
    b_simple: list[float | None] | None = None


class LrAtBatch(_Record):
    """A batch size's best learning rate at the primary target (:func:`sweeps.analysis.lr_scaling.best_lr_per_batch`):
    ``method`` "quadratic" or "first_to_target"; ``best_lr_bracket`` the tried LRs either side."""

    batch_size_sequences: int
    n_trials_to_target: int | None = None
    n_trials: int | None = None
    best_lr: float | None = None
    method: str | None = None
    best_lr_bracket: Interval | None = None


class MlflowRuns(_Record):
    """Where the sweep's runs are in MLflow: the parent run and each trial's child run (trial id -> run id)."""

    tracking_uri: str | None = None
    experiment_id: str | None = None
    parent_run_id: str | None = None
    child_runs: dict[str, str] | None = None


class BestCheckpoint(_Record):
    """The best trial's Hugging Face checkpoint, copied to ``OUT/best_checkpoint`` (``size_mb``: MiB)."""

    path: str
    trial_id: str
    size_mb: float


class LocalCbsPoint(_Record):
    """The local critical batch size at one branch point of ``critbatch branch`` (:mod:`sweeps.run.branching`;
    Merrill et al. 2025): the branches from the base run's state at ``tokens_seen`` tokens, each at ``k x B0``
    sequences, trained for the same window; ``k_star`` is the largest ``k`` whose loss at the window's end is
    within ``epsilon`` of the best (None when no branch ended with a loss), ``local_cbs_sequences`` is
    ``k_star x B0``. ``losses`` and ``tokens_seen_at_loss`` map ``str(k)`` to each branch's validation loss
    (nats, raw weights; None: the branch did not end with one) and the tokens it had seen when measured."""

    tokens_seen: Amount
    k_star: Amount | None = None
    local_cbs_sequences: Amount | None = None
    losses: dict[str, float | None] | None = None
    tokens_seen_at_loss: dict[str, Amount | None] | None = None


class CbsResult(_Record):
    """A sweep's critical batch size, the content of ``cbs.json`` (see the module docstring for units).

    The primary target's answer (``b_crit``, sequences; ``b_crit_tokens``; ``cbs_20``; ``s_min``, steps;
    ``e_min``, sequences) with its intervals, ``status`` (one of :data:`sweeps.analysis.STATUSES`, or
    ``no_completed_trials``, ``no_targets``, ``analysis_failed``) and ``message``; every target's fit
    (``targets``); each batch size's record (``per_batch``); the learning-rate scaling the data say; the
    ``headline`` and ``caveats``; then what the sweep adds (``sweep_id``, ``mlflow``, ``precision``, ...).
    Built by :func:`sweeps.analysis.analyze_trials` and :func:`sweeps.analysis.with_sweep_fields`.
    """

    headline: str | None = None
    trials: TrialsByStatus | None = None
    reference_batch: float | None = None
    context_length_tokens: int | None = None
    tokens_per_sequence: float | None = None
    target_rule: str | None = None
    interval_method: str | None = None
    optimizer_state_bytes_per_param: float | None = None
    n_params: Amount | None = None
    targets: list[TargetFit] | None = None
    target_loss: float | None = None
    b_crit: float | None = None
    b_crit_tokens: float | None = None
    b_crit_ci: Interval | None = None
    b_crit_ci_tokens: Interval | None = None
    b_crit_bound: str | None = None
    cbs_20: float | None = None
    cbs_20_ci: Interval | None = None
    b_compute_overhead_20: float | None = None
    b_compute_overhead_20_ci: Interval | None = None
    s_min: float | None = None
    s_min_ci: Interval | None = None
    e_min: float | None = None
    e_min_ci: Interval | None = None
    e_min_tokens: float | None = None
    e_min_ci_tokens: Interval | None = None
    fitted_batch_sizes: list[float] | None = None
    censored_points: list[CensoredPoint] | None = None
    status: str | None = None
    message: str | None = None
    per_batch: list[BatchRecord] | None = None
    b_simple: list[NoiseScaleSeries] | None = None
    lr_per_batch: list[LrAtBatch] | None = None
    #: the batch sizes whose best LR is the highest (``above``) or lowest (``below``) tried
    lr_optimum_beyond_tried: dict[str, list[int]] | None = None
    lr_scaling_exponent_fit: float | None = None
    lr_scaling_exponent_ci: Interval | None = None
    lr_scaling_rules_in_interval: list[str] | None = None
    # the exponent fitted on random LR picks (mean, sd, draws): a summary whose keys follow lr_scaling's
    lr_scaling_exponent_by_chance: dict[str, Any] | None = None
    # where the fastest trial at a target ran at an end of its tried LRs; its entries follow lr_scaling's
    lr_brackets_open: list[dict[str, Any]] | None = None
    caveats: list[str] | None = None
    sweep_id: str | None = None
    flops_per_token: Amount | None = None
    trials_planned: int | None = None
    optimizer: str | None = None
    # the versions and thread settings the sweep ran with (sweeps.run.provenance): keys vary with the platform
    provenance: dict[str, Any] | None = None
    mlflow: MlflowRuns | None = None
    # search.precision's waves and outcome: its keys follow how the search stopped (the searcher's decision,
    # a budget or a signal) and the waves' additions, as precision.json holds them
    precision: dict[str, Any] | None = None
    best_checkpoint: BestCheckpoint | None = None
    #: the local critical batch size along training (``critbatch branch``), one entry per branch point
    local_cbs: list[LocalCbsPoint] | None = None

    @property
    def fitted(self) -> bool:
        """Whether the primary target has a ``b_crit`` (a knee inside the swept batch sizes)."""
        return self.b_crit is not None

    def target(self, loss: float) -> TargetFit | None:
        """The fit at target loss ``loss`` (nats), or None if the analysis had no such target."""
        return next((t for t in self.targets or [] if t.target_loss == loss), None)


#: ``cbs.json``'s ``kind`` in a comparison's output folder (a sweep's file has no ``kind``)
COMPARISON_KIND = "comparison"


def is_comparison_record(data: object) -> bool:
    """Whether ``data`` (parsed JSON, or a record) is a comparison's ``cbs.json`` rather than a sweep's."""
    if isinstance(data, ComparisonResult):
        return True
    return isinstance(data, dict) and data.get("kind") == COMPARISON_KIND


class ComparisonPoint(_Record):
    """One (batch size, seed) cell of an arm at a target: steps, tokens and synchronizations (steps / H) to it."""

    batch_size_sequences: int
    seed: int | None = None
    steps_to_target: float
    tokens_to_target: float | None = None
    syncs_to_target: float | None = None
    trial_id: str | None = None


class ArmTargetFit(_Record):
    """One arm at one of the reference arm's targets (:func:`sweeps.analysis.compare.compare_arms`): its fit of
    ``S(B) = S_min + E_min / B`` (McCandlish et al. 2018, Eq. 2.11) with ``b_crit = E_min / S_min`` (sequences,
    and tokens), ``E_min`` in tokens and ``syncs_min = S_min / H``, each with its interval; ``status``
    ``not_analysed`` when the arm had no trials to analyse."""

    target_loss: float | None = None
    b_crit: float | None = None
    b_crit_ci: Interval | None = None
    b_crit_bound: str | None = None
    b_crit_tokens: float | None = None
    status: str | None = None
    message: str | None = None
    s_min: float | None = None
    s_min_ci: Interval | None = None
    e_min: float | None = None
    e_min_ci: Interval | None = None
    e_min_tokens: float | None = None
    e_min_tokens_ci: Interval | None = None
    syncs_min: float | None = None
    syncs_min_ci: Interval | None = None
    n_batch_sizes: int | None = None
    points: list[ComparisonPoint] | None = None


class ComparisonArm(_Record):
    """One arm of a comparison: how it synchronizes (``sync``, every ``sync_every_steps`` H steps, 1 for ddp;
    ``replicas``), its optimizer, the medians its trials measured (``comm_bytes_per_step``, bytes;
    ``comm_time_s``, seconds; ``tokens_per_s``), its sweep's ``status`` and ``sweep_id``, and its fit at each
    of the reference arm's targets."""

    name: str
    sync: str | None = None
    sync_every_steps: int | None = None
    replicas: int | None = None
    optimizer: str | None = None
    optimizer_state_bytes_per_param: Amount | None = None
    comm_bytes_per_step: Amount | None = None
    comm_time_s: Amount | None = None
    tokens_per_s: Amount | None = None
    status: str | None = None
    sweep_id: str | None = None
    targets: list[ArmTargetFit] = []


class ArmAtTarget(_Record):
    """An arm's ``b_crit`` (sequences) with its interval, bound and status at one target, as the target's row shows it."""

    b_crit: float | None = None
    b_crit_ci: Interval | None = None
    b_crit_bound: str | None = None
    status: str | None = None


class ComparisonAtTarget(_Record):
    """Every arm at one target loss (nats): its ``b_crit``, whether its interval overlaps the reference arm's
    (None: an interval is missing) and its ratio to the reference's ``b_crit`` (None: either is missing)."""

    target_loss: float
    primary: bool = False
    arms: dict[str, ArmAtTarget] = {}
    intervals_overlap_reference: dict[str, bool | None] = {}
    b_crit_ratio_to_reference: dict[str, float | None] = {}


class ComparisonResult(_Record):
    """A comparison's ``cbs.json`` (``kind: comparison``; :mod:`sweeps.run.compare`): every arm analysed at the
    reference (first) arm's target losses ``targets`` (nats), ``target_loss`` the reference's primary one;
    each arm's fits (``arms``), the arms side by side at each target (``by_target``), one sentence per arm
    (``summary``), then the comparison's id, name and each arm's output folder. Built from
    :func:`sweeps.analysis.compare.compare_arms`."""

    kind: str = COMPARISON_KIND
    reference_arm: str
    targets: list[float] = []
    target_loss: float | None = None
    arms: list[ComparisonArm] = []
    by_target: list[ComparisonAtTarget] = []
    summary: list[str] = []
    comparison_id: str | None = None
    name: str | None = None
    arm_outputs: dict[str, str] | None = None

    def primary_index(self) -> int:
        """The index in ``targets`` (and in each arm's ``targets``) of the primary target; 0 without one."""
        return next((k for k, t in enumerate(self.targets) if t == self.target_loss), 0)
