"""``search.strategy: transfer``: batch sizes run outward from the base batch size, each centring its trials'
LRs on its anchor's best LR scaled by the measured exponent; the rules are :mod:`sweeps.search.transfer`'s pure
functions, this class keeps their state and places each group in its study."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import optuna

from sweeps.search.space import LR_OFFSET, beta2_space, lr_offset_space, transfer_hyperparameters
from sweeps.search.strategies.base import Group, SearchStrategy
from sweeps.search.transfer import (
    MAX_PROBE_OFFSET_OCTAVES,
    anchor_of,
    lr_offsets_octaves,
    start_centre,
    transfer_order,
)
from sweeps.spec import SweepSpec

__all__ = ["TRANSFER_POINT_ATTR", "TransferStrategy"]

#: Optuna user attribute of a trial enqueued by ``search.strategy: transfer``: its index among its batch size's
TRANSFER_POINT_ATTR = "critbatch.transfer_point"


class TransferStrategy(SearchStrategy):
    """LR transfer across batch sizes (:mod:`sweeps.search.transfer`).

    Batch sizes are handed out in :func:`~sweeps.search.transfer.transfer_order`; one whose anchor has not
    finished waits; each group's point (its LR offset from the centre, in octaves, and the carried beta2) is
    enqueued just before it is asked. State: ``transfer_state``, per batch size ``{"centre_lr", "alpha",
    "anchor", "carried"}`` once started and ``"best_lr"``, ``"best_params"``, ``"best_by"`` once its groups
    have all ended.
    """

    name = "transfer"
    places_lr_probes = True

    def __init__(self, spec: SweepSpec) -> None:
        super().__init__(spec)
        self.transfer_state: dict[int, dict[str, Any]] = {}

    def search_space(self) -> dict[str, optuna.distributions.BaseDistribution]:
        """:data:`~sweeps.search.space.LR_OFFSET` (:func:`~sweeps.search.space.lr_offset_space`) in place of the LR
        rule and multiplier, and the searched beta2 dimension (:func:`~sweeps.search.space.beta2_space`)."""
        return {**lr_offset_space(), **beta2_space(self.spec)}

    def order(self, batch_sizes: Sequence[int]) -> list[int]:
        """:func:`~sweeps.search.transfer.transfer_order` from ``search.base_batch_size_sequences``."""
        return transfer_order(list(batch_sizes), self.spec.search.base_batch_size_sequences)

    def next_batch_size(self, batch_sizes: Sequence[int], has_trials_left: Callable[[int], bool]) -> int | None:
        """The first batch size, in transfer order, with trials left whose anchor has finished."""
        return next((b for b in batch_sizes if has_trials_left(b) and self._ready(b, batch_sizes)), None)

    def _ready(self, b: int, batch_sizes: Sequence[int]) -> bool:
        """``b`` may start (it is the first batch size, or its anchor has had every trial end)."""
        if b in self.transfer_state:
            return True
        anchor = anchor_of(b, list(batch_sizes))
        return anchor is None or "best_lr" in self.transfer_state.get(anchor, {})

    def start(self, batch_size: int, batch_sizes: Sequence[int]) -> None:
        """Fix ``batch_size``'s centre LR (:func:`~sweeps.search.transfer.start_centre`) and the beta2 its trials
        carry (the first batch size's)."""
        if batch_size in self.transfer_state:
            return
        anchor = anchor_of(batch_size, list(batch_sizes))
        best = {a: st["best_lr"] for a, st in self.transfer_state.items() if "best_lr" in st}
        centre, alpha = start_centre(self.spec.search, batch_size, anchor, best)
        carried = self._first_beta2() if anchor is None else dict(self.transfer_state[anchor]["carried"])
        self.transfer_state[batch_size] = {"centre_lr": centre, "alpha": alpha, "anchor": anchor, "carried": carried}

    def _first_beta2(self) -> dict[str, Any]:
        """The searched beta2 dimension's value: the geometric middle of the half-life range, or the first of
        ``beta2.values`` (empty when beta2 is fixed)."""
        beta2, space = self.spec.search.beta2, self.search_space()
        if "beta2_half_life_tokens" in space and beta2.half_life_tokens is not None:
            lo, hi = beta2.half_life_tokens
            return {"beta2_half_life_tokens": math.sqrt(lo * hi)}
        if "beta2" in space and beta2.values is not None:
            return {"beta2": beta2.values[0]}
        return {}

    def point(self, batch_size: int, index: int, probe_lrs: Sequence[float]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The group's LR offset (:func:`~sweeps.search.transfer.lr_offsets_octaves`; a ``search.precision``
        probe's, clipped to :data:`~sweeps.search.transfer.MAX_PROBE_OFFSET_OCTAVES`) and the carried beta2.
        Derived from the group's index, so a searcher restored from an older save asks the same point again."""
        k, state = self.spec.search.trials_per_batch_size, self.transfer_state[batch_size]
        if index < k:
            offset = lr_offsets_octaves(k)[index]
        else:  # a search.precision probe at a chosen LR
            offset = min(
                max(math.log2(probe_lrs[index - k] / state["centre_lr"]), -MAX_PROBE_OFFSET_OCTAVES),
                MAX_PROBE_OFFSET_OCTAVES,
            )
        return {LR_OFFSET: offset, **state["carried"]}, {TRANSFER_POINT_ATTR: index}

    def hyperparameters(self, batch_size: int, params: dict[str, Any]) -> dict[str, Any]:
        """:func:`sweeps.search.space.transfer_hyperparameters` around the batch size's centre LR."""
        return transfer_hyperparameters(self.spec, batch_size, params, self.transfer_state[batch_size]["centre_lr"])

    def group_ended(
        self, group: Group, objective: float | None, batch_groups: list[Any] | None, fastest: Callable[[list[Any]], Any]
    ) -> None:
        """Keep the batch size's best LR once every group has ended: its fastest group's at the fit's targets
        (``best_by: tokens_to_targets``), else the lowest objective's (``final_loss``); a batch size whose
        trials all failed keeps its centre."""
        state = self.transfer_state.setdefault(group.batch, {})
        if objective is not None and objective < state.get("best_objective", math.inf):
            state.update(
                best_objective=objective,
                best_params=dict(group.params),
                best_group_lr=state["centre_lr"] * 2.0 ** float(group.params.get(LR_OFFSET, 0.0)),
            )
        if batch_groups is None:
            return
        best = fastest(batch_groups)
        if best is not None:  # what the fit uses: tokens to its target losses
            state.update(
                best_params=dict(best.params),
                best_by="tokens_to_targets",
                best_group_lr=state["centre_lr"] * 2.0 ** float(best.params.get(LR_OFFSET, 0.0)),
            )
        else:
            state["best_by"] = "final_loss"
        state["best_lr"] = state.get("best_group_lr", state["centre_lr"])

    def places_probe(self, batch_size: int, lr: float) -> bool:
        """Within :data:`~sweeps.search.transfer.MAX_PROBE_OFFSET_OCTAVES` of the batch size's centre."""
        centre = self.transfer_state.get(batch_size, {}).get("centre_lr")
        return bool(centre) and abs(math.log2(lr / centre)) <= MAX_PROBE_OFFSET_OCTAVES
