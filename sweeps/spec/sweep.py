"""The whole sweep spec (:class:`SweepSpec`) and its sweep-level sections: the sweep budget, pruning
and branching. Cross-field rules (batch sizes divisible by the workers, at least two steps of the
largest batch, a fine-tuning section exactly when the workload is fine-tuning) live here.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_serializer, model_validator

from sweeps.spec._errors import describe_errors
from sweeps.spec.finetune import FinetuneSpec
from sweeps.spec.search import SearchSpec
from sweeps.spec.sections import (
    MAX_BATCH_SEQUENCES,
    MAX_TOKENS,
    BatchWarmupSpec,
    DataSpec,
    EvalSpec,
    ModelSpec,
    NoiseScaleSpec,
    OptimizerSpec,
    PositiveInt,
    ResourcesSpec,
    ScheduleSpec,
    _Strict,
)
from sweeps.spec.tracking import COMPARISON_TAG_KEYS, TrackingSpec
from workloads.api import WorkloadName, local_sync_error

__all__ = ["ArmSpec", "BranchSpec", "BudgetSpec", "PruningSpec", "SweepSpec", "deep_merge"]


def deep_merge(base: dict, over: dict) -> dict:
    """``over`` merged into ``base``: mappings merge key by key, anything else (lists too) replaces."""
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


#: top-level spec fields an arm may not override: its identity and MLflow location are the comparison's
_ARM_FIXED_FIELDS = ("name", "arms", "tracking")


class ArmSpec(_Strict):
    """One arm of a comparison: a name and the spec fields it changes (deep-merged over the rest).

    Written flat in YAML, ``{name: diloco-h4, resources: {sync: {mode: diloco}}}``; ``overrides`` holds
    everything but the name. A list (``search.batch_sizes_sequences``) replaces, a mapping merges; set
    a field to ``null`` to clear it (e.g. ``search.beta2.half_life_tokens: null`` beside ``values``).
    """

    name: str = Field(description="the arm's name: letters, digits, '-' and '_' (at most 24)")
    overrides: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        if isinstance(data, dict) and "overrides" not in data:
            return {"name": data.get("name"), "overrides": {k: v for k, v in data.items() if k != "name"}}
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,23}", v):
            raise ValueError("use 1-24 letters, digits, '_' or '-', starting with a letter or digit")
        return v

    @field_validator("overrides")
    @classmethod
    def _not_fixed(cls, v: dict[str, Any]) -> dict[str, Any]:
        fixed = [k for k in _ARM_FIXED_FIELDS if k in v]
        if fixed:
            raise ValueError(f"an arm cannot set {fixed}: the comparison's name and tracking are every arm's")
        return v

    @model_serializer(mode="plain")
    def _dump(self) -> dict[str, Any]:
        return {"name": self.name, **self.overrides}


class BranchSpec(_Strict):
    """Local critical batch size by branching (Merrill et al. 2025)."""

    points_fraction: list[Annotated[float, Field(ge=0, le=1)]] = Field(
        default_factory=lambda: [0.0, 0.1, 0.25, 0.5, 1.0]
    )
    multipliers: list[Annotated[float, Field(gt=0)]] = Field(default_factory=lambda: [0.5, 1, 2, 4, 8])
    window_tokens: PositiveInt = Field(default=32768, le=MAX_TOKENS)
    epsilon: float = Field(default=0.01, gt=0)
    base_batch_size_sequences: PositiveInt | None = Field(default=None, le=MAX_BATCH_SEQUENCES)


class BudgetSpec(_Strict):
    """Sweep-wide limits; the sweep plans to fit and stops cleanly when one runs out."""

    sweep_flops: float | None = Field(
        default=None, gt=0, le=1e30, description="FLOPs for the whole sweep (at most 1e30)"
    )
    wall_clock_s: float | None = Field(default=None, gt=0, le=90 * 86400, description="seconds (at most 90 days)")


class PruningSpec(_Strict):
    """Equal-compute early stopping within each batch size (rungs in FLOPs)."""

    enabled: bool = Field(default=False, strict=True)
    grace_fraction: float = Field(default=0.25, gt=0, lt=1, description="first rung, as a fraction of the trial budget")
    reduction_factor: float = Field(default=2.0, gt=1, le=100)
    min_trials_per_rung: PositiveInt = Field(default=2, le=1000)
    rule: Literal["loss_at_rung", "predicted_final"] = Field(
        default="predicted_final",
        description="what a trial is judged on at a rung: its validation loss there, or its loss at the budget "
        "predicted from the rung's fit points (sweeps.pruning.scheduler, docs/search_efficiency.md)",
    )
    fit_fractions: list[Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=lambda: [0.5, 0.75, 1.0],
        description="predicted_final: where the loss is read for the fit, as fractions of the rung's FLOPs",
    )

    mode: Literal["stop", "pause"] = Field(
        default="pause",
        description="stop: a trial is judged when it reaches a rung, against the values recorded there so far "
        "(asynchronous successive halving); pause: it waits paused at the rung until every trial of "
        "its batch size has reached it, then the best resume from their checkpoints (successive "
        "halving; fewer FLOPs, one restart per promoted trial)",
    )
    margin: float | None = Field(
        default=None,
        ge=0,
        description="if set: at a rung, the trials whose value is within this many nats of the best recorded "
        "there (same batch size) continue, instead of the top 1/reduction_factor",
    )

    @field_validator("fit_fractions")
    @classmethod
    def _fit_fractions(cls, v: list[float]) -> list[float]:
        if len(set(v)) < 2 or len(set(v)) != len(v):
            raise ValueError("give at least 2 distinct fractions")
        return sorted(v)


class SweepSpec(_Strict):
    """A whole critical-batch-size sweep."""

    name: str = Field(description="sweep name: letters, digits, '-', '_' and '.'; names the MLflow experiment")
    workload: WorkloadName = "pretrain"
    model: ModelSpec = Field(default_factory=ModelSpec)
    data: DataSpec
    finetune: FinetuneSpec | None = None
    budget_tokens: PositiveInt = Field(
        le=MAX_TOKENS, description="training tokens per trial (equal for every batch size; at most 1e13)"
    )
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    search: SearchSpec
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    noise_scale: NoiseScaleSpec = Field(default_factory=NoiseScaleSpec)
    batch_warmup: BatchWarmupSpec | None = None
    branch: BranchSpec | None = None
    pruning: PruningSpec = Field(default_factory=PruningSpec)
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    seeds: list[Annotated[int, Field(ge=0, le=2**31 - 1, strict=True)]] = Field(
        default_factory=lambda: [0], min_length=1, max_length=100, description="training seeds (1-100 of them)"
    )
    targets: list[Annotated[float, Field(gt=0, le=1000)]] | None = Field(
        max_length=20,
        default=None,
        description="target validation losses; default: chosen from the curves (3-5 reached by the small batches)",
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    arms: list[ArmSpec] = Field(
        default_factory=list,
        max_length=16,
        description="a comparison: each arm is this spec with its overrides, run as a sweep of its own into "
        "OUT/arms/NAME; OUT/cbs.json then sets the arms' critical batch sizes side by side "
        "(sweeps.run.compare). Empty: one sweep",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", v):
            raise ValueError("use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit")
        return v

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError("seeds must be unique")
        return v

    @model_validator(mode="after")
    def _cross_field(self) -> SweepSpec:
        errs: list[str] = []
        w = self.resources.workers_per_trial
        bad = [b for b in self.search.batch_sizes_sequences if b % w]
        if bad:
            errs.append(f"search.batch_sizes_sequences: {bad} not divisible by resources.workers_per_trial={w}")
        T = self.model.context_length_tokens
        largest = max(self.search.batch_sizes_sequences) * T
        if self.budget_tokens < 2 * largest:
            errs.append(
                f"budget_tokens ({self.budget_tokens}) gives the largest batch ({largest} tokens/step) fewer than 2 steps"
            )
        if self.schedule.warmup_tokens >= self.budget_tokens:
            errs.append("schedule.warmup_tokens must be smaller than budget_tokens")
        if self.workload == "finetune" and self.finetune is None:
            errs.append("finetune: required when workload is 'finetune'")
        if self.workload == "pretrain" and self.finetune is not None:
            errs.append("finetune: only allowed when workload is 'finetune'")
        if self.search.strategy == "transfer" and self.pruning.enabled and self.pruning.mode == "pause":
            errs.append(
                "search.strategy: transfer starts a batch size when its neighbour's trials have ended; "
                "pruning.mode pause keeps trials waiting for others: use pruning.mode stop"
            )
        precision = self.search.precision
        if precision is not None:
            if self.pruning.enabled and self.pruning.mode == "pause":
                errs.append(
                    "search.precision waits for every trial of a wave to end; pruning.mode pause keeps "
                    "trials waiting for others: use pruning.mode stop"
                )
            if precision.max_trials is not None and precision.max_trials < self.n_trials:
                errs.append(
                    f"search.precision.max_trials ({precision.max_trials}) is below the planned trials "
                    f"({self.n_trials}: batch sizes x trials_per_batch_size x seeds)"
                )
        errs += self._parallelism_errors()
        errs += self._sync_errors()
        errs += self._optimizer_errors()
        if errs:
            raise ValueError("; ".join(errs))
        return self

    @model_validator(mode="before")
    @classmethod
    def _default_strategy(cls, data: Any) -> Any:
        """``search.strategy`` left out: ``transfer``, except where it cannot run (``search.initial_points``
        given, or pruning in mode ``pause``): ``independent``."""
        if not (isinstance(data, dict) and isinstance(data.get("search"), dict)) or "strategy" in data["search"]:
            return data
        return {**data, "search": {**data["search"], "strategy": _strategy_default(data)}}

    @model_validator(mode="after")
    def _arms_valid(self) -> SweepSpec:
        if not self.arms:
            return self
        errs: list[str] = []
        names = [a.name for a in self.arms]
        if len(self.arms) < 2:
            errs.append("arms: a comparison needs at least 2 arms")
        if len(set(names)) != len(names):
            errs.append(f"arms: names must be unique, got {names}")
        if len(self.name) + 1 + max(len(n) for n in names) > 63:
            errs.append(f"arms: name '{self.name}' plus '.' plus the longest arm name must fit 63 characters")
        for i, arm in enumerate(self.arms):
            try:
                self._arm_spec(arm)
            except ValidationError as exc:
                for path, msg in describe_errors(exc, SweepSpec):
                    errs.append(f"arms.{i} ({arm.name}): " + ("" if path == "<root>" else f"{path}: ") + msg)
        if errs:
            raise ValueError("; ".join(errs))
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        out = handler(self)  # one sweep dumps (and fingerprints) as it did before comparisons existed
        if not out.get("arms"):
            out.pop("arms", None)
        return out

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        # Pickled (Tune's state of a sweep, Ray's object store) as its JSON dump, rebuilt by validation: a
        # sweep's state then outlives a refactor of the spec's sections between its start and its resume.
        return _spec_from_dump, (self.model_dump(mode="json"),)

    def _arm_spec(self, arm: ArmSpec) -> SweepSpec:
        base = self.model_dump(mode="json")
        base.pop("arms", None)
        search_over = (arm.overrides or {}).get("search")
        if not (isinstance(search_over, dict) and "strategy" in search_over) and base["search"].get(
            "strategy"
        ) == _strategy_default({**base, "search": {k: v for k, v in base["search"].items() if k != "strategy"}}):
            base["search"].pop("strategy")  # the default: chosen again for the arm (its pruning, initial points)
        derived = deep_merge(base, arm.overrides)
        derived["name"] = f"{self.name}.{arm.name}"
        tracking = dict(derived.get("tracking") or {})
        tracking["experiment"] = self.experiment_name  # every arm's runs in the comparison's experiment
        tracking["tags"] = {
            **tracking.get("tags", {}),
            COMPARISON_TAG_KEYS[0]: self.name,
            COMPARISON_TAG_KEYS[1]: arm.name,
        }
        derived["tracking"] = tracking
        return SweepSpec.model_validate(derived)

    def arm_specs(self) -> list[tuple[str, SweepSpec]]:
        """The comparison's arms as whole sweep specs, ``[(arm name, spec)]`` in the spec's order.

        Each is this spec (without ``arms``) with the arm's overrides deep-merged over it, named
        ``NAME.ARM``, in this spec's MLflow experiment, with the tags ``critbatch.comparison`` and
        ``critbatch.arm``. Empty for a single sweep.
        """
        return [(arm.name, self._arm_spec(arm)) for arm in self.arms]

    def _parallelism_errors(self) -> list[str]:
        """``resources.parallelism: fsdp`` needs the pretrain workload, 2+ workers, no branching."""
        r = self.resources
        if r.parallelism != "fsdp":
            return []
        errs = []
        if r.workers_per_trial < 2:
            errs.append(
                f"resources.parallelism: fsdp shards the model over a trial's workers and needs "
                f"workers_per_trial >= 2 (got {r.workers_per_trial}); use ddp with one worker"
            )
        if self.workload != "pretrain":
            errs.append("resources.parallelism: fsdp is for the pretrain workload; finetune (full or LoRA) runs ddp")
        if self.branch is not None:
            errs.append(
                "resources.parallelism: fsdp cannot run branch (branched training runs each branch in one "
                "process); use ddp"
            )
        return errs

    def _sync_errors(self) -> list[str]:
        """``resources.sync`` local_sgd / diloco: 2+ workers (the replicas), ddp, pretrain, no branch,
        no batch warmup, and at least one synchronisation in every batch size's budget."""
        r = self.resources
        mode = r.sync.mode
        if mode == "ddp":
            return []
        errs = []
        if r.workers_per_trial < 2:
            errs.append(f"resources.sync: {mode} needs workers_per_trial >= 2 replicas (got {r.workers_per_trial})")
        local_error = local_sync_error(mode, r.parallelism, where="resources")  # the rule TrainingConfig keeps too
        if local_error:
            errs.append(local_error)
        if self.workload != "pretrain":
            errs.append(f"resources.sync: {mode} is for the pretrain workload; finetune runs ddp")
        if self.branch is not None:
            errs.append(
                f"resources.sync: {mode} cannot run branch (branched training runs each branch in one process); use ddp"
            )
        if self.batch_warmup is not None:
            errs.append(f"resources.sync: {mode} cannot run with batch_warmup; use ddp")
        h, T = r.sync.every_steps, self.model.context_length_tokens
        steps = {b: self.budget_tokens // (b * T) for b in sorted(self.search.batch_sizes_sequences)}
        never = [b for b, n in steps.items() if n < h]
        if never:
            errs.append(
                f"resources.sync.every_steps={h} is more than the optimizer steps of batch size(s) "
                f"{never} (budget_tokens / (batch x context) = {[steps[b] for b in never]}): "
                f"their replicas would never synchronise; lower every_steps or drop those batch sizes"
            )
        return errs

    def _optimizer_errors(self) -> list[str]:
        """``optimizer.name`` against the searched beta2 and fsdp (docs/design.md, "Optimizers")."""
        o, r, b2 = self.optimizer, self.resources, self.search.beta2
        errs = []
        searched = (
            b2.half_life_tokens is not None
            and b2.half_life_tokens[0] < b2.half_life_tokens[1]
            or len(b2.values or []) > 1
        )
        if not o.reads_beta2 and searched:
            errs.append(
                f"optimizer.name={o.name} has no beta2: set search.beta2.values to a single value "
                "(it is not read) instead of searching beta2"
            )
        if r.parallelism == "fsdp" and o.name in ("adafactor", "adamw_8bit"):
            errs.append(
                f"optimizer.name={o.name} cannot run with resources.parallelism: fsdp (its state is not "
                "sharded like the parameters); use ddp, or adamw / sgd_momentum"
            )
        return errs

    # ---- derived values -------------------------------------------------------------------------

    @property
    def experiment_name(self) -> str:
        return self.tracking.experiment or self.name

    @property
    def n_trials(self) -> int:
        """Planned Tune trials: batch sizes x trials per batch size x seeds."""
        return len(self.search.batch_sizes_sequences) * self.search.trials_per_batch_size * len(self.seeds)

    @property
    def max_trials(self) -> int:
        """The most Tune trials the sweep may run: the planned ones, or with ``search.precision`` its
        ``max_trials`` (default twice the planned)."""
        p = self.search.precision
        if p is None:
            return self.n_trials
        return p.max_trials if p.max_trials is not None else 2 * self.n_trials

    @property
    def max_tune_trials(self) -> int:
        """Tune's cap on the trials it starts (``num_samples``): :attr:`max_trials`, or with token reallocation,
        where ``max_trials`` counts budgets and a trial may end at its first milestone, that many milestones'
        worth of trials (the searcher's own count stops the sweep first)."""
        p = self.search.precision
        if p is not None and p.reallocate_tokens:
            return self.max_trials * self.eval.milestones
        return self.max_trials

    def sweepable_batch_size(self, batch_size_sequences: int) -> bool:
        """Whether ``search.precision`` may add this batch size (sequences): within the spec's limit, divisible
        by the workers per trial, and one whose step is no longer than the milestone spacing (each milestone
        at least one step; so also at least 2 steps in the budget when there are 2 or more milestones)."""
        b = batch_size_sequences
        spacing = self.budget_tokens / self.eval.milestones
        steps = self.budget_tokens // (b * self.model.context_length_tokens)
        synced = self.resources.sync.mode == "ddp" or steps >= self.resources.sync.every_steps  # as _sync_errors asks
        return (
            1 <= b <= MAX_BATCH_SEQUENCES
            and b % self.resources.workers_per_trial == 0
            and synced
            and b * self.model.context_length_tokens <= spacing
            and steps >= 2
        )

    def milestones_tokens(self, budget_tokens: int | None = None) -> list[int]:
        """Token counts at which a trial evaluates, evenly spaced, the last one the budget.

        Args:
            budget_tokens: the trial's own budget (token reallocation gives a re-run a multiple of the spec's):
                the spec's spacing (``budget_tokens / eval.milestones``) goes on up to it; default the spec's.
        """
        n = self.eval.milestones
        budget = self.budget_tokens if budget_tokens is None else int(budget_tokens)
        out = [int(round(self.budget_tokens * (i + 1) / n)) for i in range(n * -(-budget // self.budget_tokens))]
        return [m for m in out if m < budget] + [budget]

    def fingerprint(self) -> str:
        """A short hash of the spec's content (used as part of the sweep id). ``search.strategy: independent``
        is left out, so a sweep from before the field existed keeps its fingerprint."""
        data = self.model_dump(mode="json")
        if data["search"].get("strategy") == "independent":
            data["search"].pop("strategy")
        blob = json.dumps(data, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:10]


def _strategy_default(data: dict[str, Any]) -> str:
    """The ``search.strategy`` a spec (a mapping) without one gets: ``transfer``, or ``independent`` with
    ``search.initial_points`` or pruning in mode ``pause`` (where transfer cannot run)."""
    pruning = data["pruning"] if isinstance(data.get("pruning"), dict) else {}
    pause = bool(pruning.get("enabled")) and pruning.get("mode", PruningSpec.model_fields["mode"].default) == "pause"
    return "independent" if (data.get("search") or {}).get("initial_points") or pause else "transfer"


def with_stored_defaults(data: Any) -> Any:
    """A spec a sweep stored (``OUT/spec.yaml``, a pickled dump) with the defaults of when it was written:
    one without ``search.strategy`` was written when ``independent`` was the default (before 2026-12-05),
    since when the strategy is always written; one without ``search.lr_lattice_octaves`` was written before
    the LR lattice existed, and runs on unsnapped LRs (null), as it started. Anything else is returned unchanged."""
    if not (isinstance(data, dict) and isinstance(data.get("search"), dict)):
        return data
    search = dict(data["search"])
    if "strategy" not in search:
        search["strategy"] = "independent"
    if "lr_lattice_octaves" not in search:
        search["lr_lattice_octaves"] = None
    return {**data, "search": search}


def _spec_from_dump(data: dict[str, Any]) -> SweepSpec:
    """A pickled :class:`SweepSpec` read back (``SweepSpec.__reduce__``)."""
    return SweepSpec.model_validate(with_stored_defaults(data))
