"""``search.strategy: independent``: every batch size's Optuna study samples the LR rule, LR multiplier and
beta2 on its own; batch sizes are handed trials round-robin; ``search.initial_points`` come first in every
study."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import optuna

from sweeps.search.space import hyperparameters_for
from sweeps.search.strategies.base import INITIAL_POINT_ATTR, SearchStrategy
from sweeps.spec import SweepSpec

__all__ = ["INITIAL_POINTS_ENQUEUED_ATTR", "IndependentStrategy"]

#: study user attribute: how many initial points were enqueued (so a restored study does not enqueue them again)
INITIAL_POINTS_ENQUEUED_ATTR = "critbatch.initial_points_enqueued"


class IndependentStrategy(SearchStrategy):
    """One Optuna study per batch size, each searching the spec's space independently (the methodology note's
    fair comparison: each batch size gets its own tuned hyperparameters). State: the round-robin cursor."""

    name = "independent"

    def __init__(self, spec: SweepSpec) -> None:
        super().__init__(spec)
        self._rr = 0  # the round-robin cursor: index of the batch size asked next

    def next_batch_size(self, batch_sizes: Sequence[int], has_trials_left: Callable[[int], bool]) -> int | None:
        """Round-robin over ``batch_sizes``, skipping those with no trial left."""
        n = len(batch_sizes)
        for i in range(n):
            b = batch_sizes[(self._rr + i) % n]
            if has_trials_left(b):
                self._rr = (self._rr + i + 1) % n
                return b
        return None

    def prepare_study(self, study: optuna.Study, space: dict[str, Any]) -> None:
        """In a new study, enqueue ``search.initial_points`` in order (user attribute :data:`INITIAL_POINT_ATTR`:
        the point's index), the dimensions outside ``space`` left out."""
        points = self.spec.search.initial_points
        if not points or study.user_attrs.get(INITIAL_POINTS_ENQUEUED_ATTR) or study.get_trials(deepcopy=False):
            return
        for i, p in enumerate(points):
            study.enqueue_trial({k: v for k, v in p.given().items() if k in space}, user_attrs={INITIAL_POINT_ATTR: i})
        study.set_user_attr(INITIAL_POINTS_ENQUEUED_ATTR, len(points))

    def hyperparameters(self, batch_size: int, params: dict[str, Any]) -> dict[str, Any]:
        """:func:`sweeps.search.space.hyperparameters_for`."""
        return hyperparameters_for(self.spec, batch_size, params)
