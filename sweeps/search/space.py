"""The search space of each batch size's Optuna study, and the hyperparameters a trial gets from a sample.

:func:`lr_rule_space`, :func:`lr_offset_space` and :func:`beta2_space` are the dimensions a strategy's
search space (``SearchStrategy.search_space``) is made of: the LR rule and multiplier, or an LR offset in octaves
(``search.strategy: transfer``), and beta2 or its token half-life;
:func:`hyperparameters_for` and :func:`transfer_hyperparameters` turn a sample into the trial's LR and
beta2 (``workloads.api.scaled_lr``, ``beta2_from_half_life``). Used by
:class:`sweeps.search.searcher.BatchSizeSearcher`.
"""

from __future__ import annotations

from typing import Any

import optuna

from sweeps.search.lattice import snap_lr
from sweeps.search.transfer import MAX_PROBE_OFFSET_OCTAVES
from sweeps.spec import SweepSpec
from workloads.api import beta2_from_half_life, half_life_from_beta2, scaled_lr

__all__ = [
    "LR_OFFSET",
    "beta2_space",
    "hyperparameters_for",
    "lr_offset_space",
    "lr_rule_space",
    "study_connect_args",
    "study_storage",
    "transfer_hyperparameters",
]


#: the Optuna parameter of ``search.strategy: transfer``: a trial's LR offset from its batch size's
#: centre, in octaves (:mod:`sweeps.search.transfer`)
LR_OFFSET = "lr_offset_octaves"


def study_storage(url: str) -> optuna.storages.RDBStorage:
    """The Optuna RDB storage at ``url`` (``sqlite:///...`` or a server database such as ``postgresql://...``).

    SQLite gets a 30 s lock wait (``timeout``: trials of several batch sizes write at once); a server database
    gets no driver option of SQLite's (psycopg2 refuses ``timeout`` with "invalid connection option").
    """
    return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": study_connect_args(url)})


def study_connect_args(url: str) -> dict[str, Any]:
    """The database driver's connect options for :func:`study_storage`: SQLite's lock wait in seconds, or none."""
    return {"timeout": 30} if url.startswith("sqlite") else {}


def lr_rule_space(spec: SweepSpec) -> dict[str, optuna.distributions.BaseDistribution]:
    """Optuna distributions of the LR rule (where ``search.lr_rules`` names more than one) and the LR multiplier
    (log-uniform, where ``search.lr_multiplier`` is a range): a batch size's own LR, sampled by its study."""
    s = spec.search
    space: dict[str, optuna.distributions.BaseDistribution] = {}
    if len(s.lr_rules) > 1:
        space["lr_rule"] = optuna.distributions.CategoricalDistribution(list(s.lr_rules))
    lo, hi = s.lr_multiplier
    if lo < hi:
        space["lr_multiplier"] = optuna.distributions.FloatDistribution(lo, hi, log=True)
    return space


def lr_offset_space() -> dict[str, optuna.distributions.BaseDistribution]:
    """The Optuna distribution of :data:`LR_OFFSET` (octaves from a batch size's centre LR), up to
    :data:`~sweeps.search.transfer.MAX_PROBE_OFFSET_OCTAVES` either way: wider than a batch size's own spread,
    as ``search.precision``'s probes go beyond it."""
    return {LR_OFFSET: optuna.distributions.FloatDistribution(-MAX_PROBE_OFFSET_OCTAVES, MAX_PROBE_OFFSET_OCTAVES)}


def beta2_space(spec: SweepSpec) -> dict[str, optuna.distributions.BaseDistribution]:
    """The Optuna distribution of beta2's token half-life (log-uniform, where ``search.beta2.half_life_tokens``
    is a range) or of beta2 itself (categorical, where ``search.beta2.values`` has more than one); empty when
    beta2 is fixed."""
    beta2 = spec.search.beta2
    if beta2.half_life_tokens is not None:
        lo, hi = beta2.half_life_tokens
        if lo < hi:
            return {"beta2_half_life_tokens": optuna.distributions.FloatDistribution(lo, hi, log=True)}
    elif beta2.values is not None and len(beta2.values) > 1:
        return {"beta2": optuna.distributions.CategoricalDistribution(list(beta2.values))}
    return {}


def hyperparameters_for(spec: SweepSpec, batch_size_sequences: int, sampled: dict[str, Any]) -> dict[str, Any]:
    """Resolve sampled values (plus the spec's fixed ones) into the trial's LR and beta2.

    Returns a dict with ``lr_rule``, ``lr_multiplier``, ``lr``, ``beta2``, ``beta2_half_life_tokens``.
    Fixed beta2 values keep beta2 fixed at this batch size; their half-life is derived from it so
    that batch-size warmup can rescale beta2 by the half-life rule.
    """
    s = spec.search
    T = spec.model.context_length_tokens
    rule = sampled.get("lr_rule", s.lr_rules[0])
    mult = float(sampled.get("lr_multiplier", s.lr_multiplier[0]))
    lr = scaled_lr(s.base_lr, s.base_batch_size_sequences, batch_size_sequences, rule, mult)
    if s.beta2.half_life_tokens is not None:
        t_half = float(sampled.get("beta2_half_life_tokens", s.beta2.half_life_tokens[0]))
        beta2 = beta2_from_half_life(t_half, batch_size_sequences, T)
    else:
        assert s.beta2.values is not None
        beta2 = float(sampled.get("beta2", s.beta2.values[0]))
        t_half = half_life_from_beta2(beta2, batch_size_sequences, T)
    return {"lr_rule": rule, "lr_multiplier": mult, "lr": lr, "beta2": beta2, "beta2_half_life_tokens": t_half}


def transfer_hyperparameters(
    spec: SweepSpec, batch_size_sequences: int, sampled: dict[str, Any], centre_lr: float
) -> dict[str, Any]:
    """:func:`hyperparameters_for` under ``search.strategy: transfer``: ``lr = centre_lr 2^offset``
    (``offset``: ``sampled[LR_OFFSET]``, octaves), moved to the nearest point of the LR lattice
    (``search.lr_lattice_octaves``, :func:`sweeps.search.lattice.snap_lr`; not with null), ``lr_rule`` the spec's
    first (it scales the LR only under batch-size warmup) and ``lr_multiplier`` the one that rule would need for
    this LR."""
    s = spec.search
    hp = hyperparameters_for(spec, batch_size_sequences, {k: v for k, v in sampled.items() if k != LR_OFFSET})
    lr = centre_lr * 2.0 ** float(sampled.get(LR_OFFSET, 0.0))
    step = getattr(s, "lr_lattice_octaves", None)
    if step:
        lr = snap_lr(lr, s.base_lr, step)
    rule = s.lr_rules[0]
    return {
        **hp,
        "lr_rule": rule,
        "lr": lr,
        "lr_multiplier": lr / scaled_lr(s.base_lr, s.base_batch_size_sequences, batch_size_sequences, rule, 1.0),
    }
