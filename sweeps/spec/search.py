"""The spec's ``search`` section: the batch sizes, what is searched at each (LR rule and multiplier, beta2),
how trials are placed (``strategy``), known points to try first, and ``precision`` (sweep until the
critical batch size's interval is as narrow as asked).

Plain data: imports neither torch nor Ray.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_serializer, model_validator

from sweeps.spec.registry import STRATEGY_REGISTRY, OneOf
from sweeps.spec.sections import MAX_BATCH_SEQUENCES, MAX_TOKENS, LrRule, PositiveInt, _Strict

__all__ = ["Beta2Spec", "InitialPointSpec", "PrecisionSpec", "SearchSpec"]


class PrecisionSpec(_Strict):
    """Sweep until precise: after each wave the sweep refits and, while the headline ``b_crit``'s
    95 % interval has an upper/lower ratio above ``b_crit_ratio`` (or its status is not ``ok``), adds up to
    ``trials_per_wave`` trials where they should narrow it most (:mod:`sweeps.search.precision`), until
    ``max_trials`` trials in all or the sweep's ``budget``. With ``reallocate_tokens`` (the default) the waves
    and ``max_trials`` count tokens, in full trials (``budget_tokens`` each, per seed): a trial that ended at
    the lowest target counts its share, a re-run its multiple, and a wave may spend what earlier waves saved.
    """

    b_crit_ratio: float = Field(
        gt=1, le=1e6, description="the widest 95 % interval asked for, as upper / lower (e.g. 3)"
    )
    max_trials: PositiveInt | None = Field(
        default=None,
        le=100_000,
        description="trials in all, the planned ones included (default: twice the planned trials); with "
        "reallocate_tokens, full trials' worth of tokens",
    )
    trials_per_wave: PositiveInt = Field(default=2, le=1000, description="trials each extra wave adds (per seed)")
    reallocate_tokens: bool = Field(
        default=True,
        strict=True,
        description="token reallocation: every trial a later wave adds ends once it reaches the lowest target "
        "the first wave declared, and a batch size censored at that target is re-run at its best "
        "trial's LR with twice the budget it had, paid from what those early stops saved",
    )
    max_budget_multiple: PositiveInt = Field(
        default=4, le=64, description="token reallocation: the longest re-run, in budget_tokens"
    )


class Beta2Spec(_Strict):
    """Adam's beta2: fixed values, or a token half-life range (Marek et al. 2025).

    With a half-life ``t_half`` in tokens, ``beta2 = 0.5 ** (B*T / t_half)``.
    Exactly one of ``values`` and ``half_life_tokens`` is given.
    """

    values: list[Annotated[float, Field(gt=0.0, lt=1.0)]] | None = None
    half_life_tokens: (
        tuple[Annotated[float, Field(gt=0, le=MAX_TOKENS)], Annotated[float, Field(gt=0, le=MAX_TOKENS)]] | None
    ) = Field(default=None, description="[low, high] in tokens (at most 1e13), searched log-uniformly")

    @model_validator(mode="after")
    def _exactly_one(self) -> Beta2Spec:
        if (self.values is None) == (self.half_life_tokens is None):
            raise ValueError("give exactly one of 'values' and 'half_life_tokens'")
        if self.values is not None and not self.values:
            raise ValueError("'values' must not be empty")
        if self.half_life_tokens is not None and self.half_life_tokens[0] > self.half_life_tokens[1]:
            raise ValueError("half_life_tokens: low must be <= high")
        return self


class InitialPointSpec(_Strict):
    """A known configuration evaluated first at every batch size (Optuna ``enqueue_trial``).

    Each field is one searched dimension; a dimension left out is sampled as usual. Give ``beta2``
    when the spec searches ``beta2.values``, ``beta2_half_life_tokens`` when it searches
    ``beta2.half_life_tokens`` (tokens, so the same point means the same averaging horizon at every
    batch size).
    """

    lr_rule: LrRule | None = Field(default=None, description="one of search.lr_rules")
    lr_multiplier: float | None = Field(
        default=None, gt=0, le=1000, description="within search.lr_multiplier [low, high] (at most 1000)"
    )
    beta2: float | None = Field(default=None, gt=0.0, lt=1.0, description="one of search.beta2.values")
    beta2_half_life_tokens: float | None = Field(
        default=None,
        gt=0,
        le=MAX_TOKENS,
        description="beta2 as a token half-life in tokens, within search.beta2.half_life_tokens (at most 1e13)",
    )

    @model_validator(mode="after")
    def _something(self) -> InitialPointSpec:
        if all(v is None for v in (self.lr_rule, self.lr_multiplier, self.beta2, self.beta2_half_life_tokens)):
            raise ValueError("give at least one of lr_rule, lr_multiplier, beta2, beta2_half_life_tokens")
        if self.beta2 is not None and self.beta2_half_life_tokens is not None:
            raise ValueError("give beta2 or beta2_half_life_tokens, not both")
        return self

    def given(self) -> dict[str, Any]:
        """The dimensions this point fixes, ``{name: value}``."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class SearchSpec(_Strict):
    """What is searched: batch sizes (a grid), and per batch size the LR rule, multiplier and beta2."""

    batch_sizes_sequences: list[Annotated[int, Field(gt=0, le=MAX_BATCH_SEQUENCES, strict=True)]] = Field(
        min_length=1, max_length=64, description="global batch sizes in sequences (1-64 of them, each at most 2^20)"
    )
    base_lr: float = Field(gt=0, lt=10)
    base_batch_size_sequences: PositiveInt = Field(
        le=MAX_BATCH_SEQUENCES,
        description="the batch the base LR is for (sequences); under search.strategy transfer one of "
        "batch_sizes_sequences, the one the search starts at",
    )
    lr_rules: list[LrRule] = Field(default_factory=lambda: ["sqrt"], min_length=1)
    lr_multiplier: tuple[Annotated[float, Field(gt=0, le=1000)], Annotated[float, Field(gt=0, le=1000)]] = (1.0, 1.0)
    beta2: Beta2Spec = Field(default_factory=lambda: Beta2Spec(values=[0.99]))
    trials_per_batch_size: PositiveInt = Field(
        default=1, le=1000, description="Optuna trials per batch size (at most 1000)"
    )
    algorithm: Literal["optuna"] = "optuna"
    strategy: Annotated[str, OneOf(STRATEGY_REGISTRY)] = Field(
        default="transfer",
        description="transfer (the default): batch sizes run outward from base_batch_size_sequences, each "
        "centring its LRs on its anchor's (the neighbour one step nearer the base) best LR scaled by "
        "the measured exponent, beta2 not searched (sweeps/search/transfer.py); independent: each "
        "batch size's study samples the LR rule and multiplier on its own (the default where "
        "transfer cannot run: with initial_points or pruning.mode pause)",
    )
    lr_lattice_octaves: float | None = Field(
        default=0.5,
        gt=0,
        le=2,
        description="search.strategy transfer: every LR a trial runs at is base_lr * 2^(k * lr_lattice_octaves) for "
        "an integer k (sweeps/search/lattice.py), so a batch size's tried LRs sit exact lattice steps "
        "apart and a sweep replays against a grid of real curves; null: LRs as placed, unsnapped",
    )
    precision: PrecisionSpec | None = Field(
        default=None,
        description="sweep until precise: after each wave of trials, refit, and add trials while b_crit's 95 % "
        "interval is wider than asked (sweeps/search/precision.py); None: run the planned trials only",
    )
    initial_points: list[InitialPointSpec] = Field(
        default_factory=list,
        max_length=1000,
        description="configurations evaluated first at every batch size, in order, before Optuna samples "
        "(enqueued trials of each batch size's study); they count in trials_per_batch_size",
    )

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        # the strategy is always written (a stored spec without it is read as independent: it was written
        # when that was the default, sweeps.spec.sweep.with_stored_defaults); the fingerprint leaves
        # "independent" out (SweepSpec.fingerprint). Without search.precision the dump is as before it existed.
        out = handler(self)
        if out.get("precision") is None:
            out.pop("precision", None)
        if out.get("lr_lattice_octaves") is None:  # a sweep stored before the lattice keeps its dump (and id)
            out.pop("lr_lattice_octaves", None)
        return out

    @field_validator("batch_sizes_sequences")
    @classmethod
    def _unique_sorted(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError("batch sizes must be unique")
        return sorted(v)

    @field_validator("lr_rules")
    @classmethod
    def _unique_rules(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("LR rules must be unique")
        return v

    @model_validator(mode="after")
    def _ranges(self) -> SearchSpec:
        lo, hi = self.lr_multiplier
        if lo > hi:
            raise ValueError("lr_multiplier: low must be <= high")
        errs = [f"initial_points.{i}.{msg}" for i, p in enumerate(self.initial_points) for msg in self._outside(p)]
        if self.strategy == "transfer" and self.initial_points:
            errs.append("initial_points: search.strategy transfer places every trial itself; use independent")
        if self.strategy == "transfer" and self.base_batch_size_sequences not in self.batch_sizes_sequences:
            errs.append(
                f"base_batch_size_sequences: {self.base_batch_size_sequences} is not one of batch_sizes_sequences "
                f"{list(self.batch_sizes_sequences)}; search.strategy transfer starts at the base batch size, "
                "where base_lr holds, and carries its LR outward: sweep it too, or give one of the swept sizes "
                "(with base_lr for it), or use search.strategy independent"
            )
        if len(self.initial_points) > self.trials_per_batch_size:
            errs.append(
                f"initial_points: {len(self.initial_points)} point(s), more than trials_per_batch_size="
                f"{self.trials_per_batch_size} (they count in it)"
            )
        seen: dict[tuple, int] = {}
        for i, p in enumerate(self.initial_points):
            key = tuple(sorted(p.given().items()))
            if key in seen:
                errs.append(f"initial_points.{i}: the same point as initial_points.{seen[key]}")
            seen.setdefault(key, i)
        if errs:
            raise ValueError("; ".join(errs))
        return self

    def _outside(self, p: InitialPointSpec) -> list[str]:
        """Why an initial point lies outside the searched space (one message per field)."""
        out = []
        if p.lr_rule is not None and p.lr_rule not in self.lr_rules:
            out.append(f"lr_rule: {p.lr_rule!r} is not one of lr_rules {list(self.lr_rules)}")
        lo, hi = self.lr_multiplier
        if p.lr_multiplier is not None and not lo <= p.lr_multiplier <= hi:
            out.append(f"lr_multiplier: {p.lr_multiplier:g} lies outside lr_multiplier [{lo:g}, {hi:g}]")
        if p.beta2 is not None:
            if self.beta2.values is None:
                out.append("beta2: the spec searches beta2.half_life_tokens: give beta2_half_life_tokens")
            elif p.beta2 not in self.beta2.values:
                out.append(f"beta2: {p.beta2:g} is not one of beta2.values {list(self.beta2.values)}")
        if p.beta2_half_life_tokens is not None:
            if self.beta2.half_life_tokens is None:
                out.append("beta2_half_life_tokens: the spec searches beta2.values: give beta2")
            else:
                lo2, hi2 = self.beta2.half_life_tokens
                if not lo2 <= p.beta2_half_life_tokens <= hi2:
                    out.append(
                        f"beta2_half_life_tokens: {p.beta2_half_life_tokens:g} lies outside "
                        f"beta2.half_life_tokens [{lo2:g}, {hi2:g}]"
                    )
        return out
