"""The search: a grid over batch sizes, and per batch size an Optuna study over the LR rule,
LR multiplier and beta2 (or its token half-life), each suggestion run once per seed.

:class:`BatchSizeSearcher` is a Ray Tune ``Searcher`` that routes every Tune trial to the
``OptunaSearch`` of its batch size (one Optuna study per batch size, in one RDB storage), so that
each batch size gets its own tuned hyperparameters: a fair comparison across batch sizes needs
that (methodology note sections 2.4 and 11.1). A suggestion is repeated for every seed; the Optuna
trial is told the mean objective over seeds, ``FAIL`` when every seed failed, ``PRUNED`` when a
seed was stopped early. The value told is tokens to a target loss, what the fit uses, with the final loss breaking
ties (:mod:`sweeps.search.objective`), or the mean final loss where the trials' records cannot be read.

``search.initial_points`` are enqueued in every batch size's study when it is created (Optuna
``enqueue_trial``, user attribute ``critbatch.initial_point``), so they are its first suggestions.
The samplers travel in the searcher's saved state: a restored sweep asks for exactly the
hyperparameters the uninterrupted one would have.
"""

from __future__ import annotations

import logging
import math
import pickle
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import TrialState
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from sweeps._compat import (
    optuna_search_completed,
    optuna_search_reattach,
    optuna_search_study,
    optuna_search_trials,
    optuna_trial_id,
)
from sweeps.files import write_atomic
from sweeps.search.objective import OBJECTIVE, Curve, curves_of, label_group_trial, tell_group
from sweeps.search.saved_state import composed_state
from sweeps.search.space import LR_OFFSET, hyperparameters_for, study_storage, transfer_hyperparameters
from sweeps.search.strategies import (
    INITIAL_POINT_ATTR,
    INITIAL_POINTS_ENQUEUED_ATTR,
    TRANSFER_POINT_ATTR,
    SearchStrategy,
    search_space,
    strategy_for,
)
from sweeps.search.transfer import fastest_to_targets, provisional_targets
from sweeps.search.waves import PrecisionWaves
from sweeps.spec import SweepSpec

__all__ = [
    "LR_OFFSET",
    "OBJECTIVE",
    "BatchSizeSearcher",
    "hyperparameters_for",
    "search_space",
    "transfer_hyperparameters",
]

log = logging.getLogger(__name__)

#: Optuna study user attribute: the fingerprint of the spec the sweep id is bound to
FINGERPRINT_ATTR = "critbatch.fingerprint"
#: set on a searcher unpickled from the layout before its strategy and wave policy were objects of their own;
#: ``sweeps.store.migrations.migrate_tune_state`` removes it when it rewrites the pickle
OLD_LAYOUT_ATTR = "_unpickled_from_old_layout"
#: the Optuna user attributes the strategies set, importable from here as before
_STRATEGY_ATTRS = (INITIAL_POINT_ATTR, INITIAL_POINTS_ENQUEUED_ATTR, TRANSFER_POINT_ATTR)
#: how a seed of a group ended, by Optuna's trial-state names (the group's one Optuna trial is told the same);
#: plain strings, as saved searchers hold them
_COMPLETE, _FAIL, _PRUNED = (s.name for s in (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED))


class _Group:
    """One Optuna suggestion, run once per seed."""

    def __init__(
        self, primary: str, batch: int, params: dict[str, Any], n_seeds: int, initial_point: int | None = None
    ):
        self.primary = primary
        self.batch = batch
        self.params = params
        self.n_seeds = n_seeds
        self.initial_point = initial_point
        self.budget_multiple = 1  # token reallocation: a re-run trains this many budgets
        self.stop_at_loss: float | None = None  # token reallocation: a probe's own stop loss, if it has one
        self.trial_ids: list[str] = []
        self.results: dict[str, tuple[str, float | None]] = {}  # trial id -> (state, objective)

    def full(self) -> bool:
        return len(self.trial_ids) >= self.n_seeds

    def finished(self) -> bool:
        return len(self.results) >= self.n_seeds


class BatchSizeSearcher(Searcher):
    """Tune searcher: batch sizes on a grid, Optuna (TPE) per batch size, seeds repeated.

    Args:
        spec: the sweep.
        storage_url: Optuna RDB storage URL (``sqlite:///OUT/optuna.db``).
        study_prefix: study names are ``{study_prefix}-B{batch}``.

        fingerprint: if given, recorded in each study (user attribute ``critbatch.fingerprint``).
        scheduler: the pruning scheduler in mode ``pause``: new trials start only when it says so
            (:meth:`~sweeps.pruning.halving.SuccessiveHalving.may_start`); None otherwise.

    Composes a search strategy (``strategy``, :mod:`sweeps.search.strategies`, chosen by ``search.strategy``:
    which batch size is asked next and where each group sits in its study) and a wave policy
    (``wave_policy``, :class:`~sweeps.search.waves.PrecisionWaves`); it keeps what they share: the trials
    handed out per batch size (``assigned``), the groups and the Optuna studies.

    Emits ``spec.n_trials`` configs, then ``Searcher.FINISHED``; with ``search.precision``, after those
    (a wave) it waits for them to end, asks the attached analysis (:meth:`attach_precision`) and either adds
    a wave of trials (:mod:`sweeps.search.precision`; ``waves`` keeps each wave's interval and what it added)
    or finishes, saying why in ``precision_outcome``. Each config holds
    ``batch_size_sequences``, ``seed``, ``group_id`` and the resolved hyperparameters, and
    ``initial_point`` (its index in ``search.initial_points``) when it is one. Under a strategy that waits
    (``transfer``: a batch size whose anchor has not finished) ``suggest`` returns None and Tune asks again.
    """

    _records = None  # default for a searcher unpickled from a sweep started before attach_records existed

    def __init__(
        self,
        spec: SweepSpec,
        storage_url: str,
        study_prefix: str,
        fingerprint: str | None = None,
        scheduler: Any = None,
    ):
        super().__init__(metric=OBJECTIVE, mode="min")
        self.spec = spec
        self.storage_url = storage_url
        self.study_prefix = study_prefix
        self.fingerprint = fingerprint
        #: pickled samplers of a restored searcher, by batch size, until their study is opened again
        self._sampler_blobs: dict[int, bytes] = {}
        self.strategy: SearchStrategy = strategy_for(spec)
        self.space = self.strategy.search_space()
        self.batches = self.strategy.order(spec.search.batch_sizes_sequences)
        self.quota = spec.search.trials_per_batch_size * len(spec.seeds)
        self.wave_policy = PrecisionWaves(spec, spec.search.precision)
        self._records = None  # attached by the driver (attach_records), never pickled
        #: per batch size, what its study is told (:mod:`sweeps.search.objective`): ``{"objective":
        #: "tokens_to_target" | "final_loss", "target_loss": nats | None}``, fixed when its first group ends
        self.objectives: dict[int, dict[str, Any]] = {}
        self.assigned: dict[int, int] = {b: 0 for b in self.batches}
        self.open_group: dict[int, _Group | None] = {b: None for b in self.batches}
        self.groups: dict[str, _Group] = {}  # tune trial id -> group
        self._subs: dict[int, OptunaSearch] | None = None
        #: the pruning scheduler in mode "pause" (``EqualComputeScheduler``): it gates new trials (paused
        #: trials do not count as running) and says which trials it pruned while they were paused
        self.scheduler = scheduler

    # ---- what the strategy and the wave policy hold, read where the searcher's attributes were -----------

    @property
    def transfer_state(self) -> dict[int, dict[str, Any]]:
        """The ``transfer`` strategy's per batch size state (centre LR, alpha, anchor, best LR); empty otherwise."""
        return getattr(self.strategy, "transfer_state", {})

    @property
    def waves(self) -> list[dict[str, Any]]:
        """One entry per ended wave (``search.precision``)."""
        return self.wave_policy.waves

    @property
    def precision_outcome(self) -> dict[str, Any] | None:
        """Why the searcher stopped adding waves, once it did (``search.precision``)."""
        return self.wave_policy.precision_outcome

    @property
    def precision_targets(self) -> list[float] | None:
        """The target losses the first wave declared (``search.precision``)."""
        return self.wave_policy.precision_targets

    def attach_scheduler(self, scheduler: Any) -> None:
        """Attach the pause-mode scheduler to a restored searcher (its pickled state leaves it out)."""
        self.scheduler = scheduler

    def attach_precision(self, analyse: Any, report: Any) -> None:
        """``search.precision``: attach the wave's analysis and report (:meth:`PrecisionWaves.attach`)."""
        self.wave_policy.attach(analyse, report)

    def trials_for(self, b: int) -> int:
        """The trials batch size ``b`` is handed, the waves' added ones included."""
        return self.quota + self.wave_policy.extra_trials(b)

    def add_batch_size(self, b: int) -> None:
        """A wave adds batch size ``b`` (sequences): it is handed trials as the planned ones."""
        self.batches.append(b)
        self.assigned[b] = 0
        self.open_group[b] = None

    def exhausted(self) -> bool:
        """True once every batch size has been handed all its trials (of the waves so far)."""
        return all(self.assigned[b] >= self.trials_for(b) for b in self.batches)

    def live(self) -> list[str]:
        """The Tune trial ids handed out that have not ended."""
        return [t for t, g in self.groups.items() if t not in g.results]

    def stop_at_loss(self) -> float | None:
        """The loss at which a trial handed out now ends (token reallocation), or None."""
        return self.wave_policy.stop_at_loss()

    # Optuna searchers hold a storage connection: build them lazily, never pickle them.
    def _sub(self, b: int) -> OptunaSearch | None:
        if not self.space:
            return None
        if self._subs is None:
            self._subs = {}
        if b not in self._subs:
            storage = study_storage(self.storage_url)
            name = f"{self.study_prefix}-B{b}"
            blob = self._sampler_blobs.pop(b, None)
            if blob is not None:  # restored: the sampler goes on where the saved state left it
                sampler = pickle.loads(blob)
            else:
                try:  # a resumed sweep without a saved sampler: the trials asked so far shift the seed, or the
                    # sampler would repeat them
                    asked = len(storage.get_all_trials(storage.get_study_id_from_name(name), deepcopy=False))
                except KeyError:
                    asked = 0
                sampler = optuna.samplers.TPESampler(seed=(self.spec.seeds[0] * 7919 + b + asked) % (2**31))
            sub = OptunaSearch(
                space=self.space, metric=OBJECTIVE, mode="min", storage=storage, study_name=name, sampler=sampler
            )
            self._prepare_study(optuna_search_study(sub), b)
            self._subs[b] = sub
        return self._subs[b]

    def _prepare_study(self, study: optuna.Study, b: int) -> None:
        """Record the spec's fingerprint, then let the strategy prepare the study (``independent`` enqueues
        ``search.initial_points`` in a new one)."""
        if self.fingerprint and study.user_attrs.get(FINGERPRINT_ATTR) != self.fingerprint:
            study.set_user_attr(FINGERPRINT_ATTR, self.fingerprint)
        self.strategy.prepare_study(study, self.space)

    def _next_batch(self) -> int | None:
        return self.strategy.next_batch_size(self.batches, lambda b: self.assigned[b] < self.trials_for(b))

    # Ray annotates suggest as returning a dict or None, and returns its own Searcher.FINISHED (a str) too
    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # pyright: ignore[reportIncompatibleMethodOverride]
        if self.scheduler is not None and not self.exhausted() and not self.scheduler.may_start(self.live()):
            return None  # as many trials running as allowed (paused ones do not count): ask again later
        b = self._next_batch()
        if b is None and self.exhausted():
            ended = self.wave_policy.end_of_wave(self)
            if ended is None:
                return None  # a wave's trials still run
            if not ended:
                return Searcher.FINISHED
            b = self._next_batch()
        if b is None:
            return None  # the strategy waits (transfer: for an anchor to finish)
        self.strategy.start(b, self.batches)
        group = self.open_group[b]
        if group is None or group.full():
            group = self._open_group(trial_id, b)
            if group is None:
                return None
        seed = self.spec.seeds[len(group.trial_ids)]
        group.trial_ids.append(trial_id)
        self.groups[trial_id] = group
        self.assigned[b] += 1
        hp = self.strategy.hyperparameters(b, group.params)
        sub = self._sub(b) if len(group.trial_ids) == 1 else None
        if sub is not None:  # a new group's Optuna trial also records its LR and batch size
            label_group_trial(sub, b, group.primary, hp["lr"])
        point = getattr(group, "initial_point", None)
        stop, multiple = self.stop_at_loss(), getattr(group, "budget_multiple", 1)
        stop = (getattr(group, "stop_at_loss", None) or stop) if stop is not None else None  # a probe's own, if higher
        extra = {
            "initial_point": point,
            "stop_at_loss": stop,  # token reallocation: the stop, a re-run's budget
            "budget_tokens": multiple * self.spec.budget_tokens if multiple > 1 else None,
        }
        return {
            "batch_size_sequences": b,
            "seed": seed,
            "group_id": group.primary,
            **hp,
            **{k: v for k, v in extra.items() if v is not None},
        }

    def _open_group(self, trial_id: str, b: int) -> _Group | None:
        """Ask ``b``'s study for a new group's values (at the strategy's point, where it places one); None when
        the study has none to give now."""
        sub = self._sub(b)
        index = len(self.groups_of(b))  # the groups of b handed out so far
        placed = self.strategy.point(b, index, self.wave_policy.probe_lrs(b)) if sub is not None else None
        if sub is not None and placed is not None:
            optuna_search_study(sub).enqueue_trial(placed[0], user_attrs=placed[1])
        params = sub.suggest(trial_id) if sub is not None else {}
        if params is None:
            return None
        point = optuna_search_trials(sub)[trial_id].user_attrs.get(INITIAL_POINT_ATTR) if sub is not None else None
        group = _Group(trial_id, b, dict(params), len(self.spec.seeds), initial_point=point)
        group.budget_multiple = self.wave_policy.next_budget_multiple(b, index)  # before the group counts among b's
        group.stop_at_loss = self.wave_policy.next_stop_at_loss(b, index)
        self.open_group[b] = group
        return group

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        # Intermediate results go to the equal-compute scheduler, not to Optuna's step-indexed pruners.
        return None

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        group = self.groups.get(trial_id)
        if group is None or trial_id in group.results:
            return
        if result is None and self.scheduler is not None and trial_id in self.scheduler.pruned_while_paused:
            result = self.scheduler.pruned_while_paused[trial_id]  # Tune passes no result for a paused trial
        if error:
            group.results[trial_id] = (_FAIL, None)
        elif result is not None and result.get("pruned"):
            group.results[trial_id] = (_PRUNED, None)
        else:
            val = None if result is None else result.get(OBJECTIVE)
            group.results[trial_id] = (
                (_COMPLETE, float(val)) if val is not None and math.isfinite(val) else (_FAIL, None)
            )
        if not group.finished():
            return
        states = [s for s, _ in group.results.values()]
        finals = {t: v for t, (s, v) in group.results.items() if s == _COMPLETE and v is not None}
        self._group_ended(group, sum(finals.values()) / len(finals) if finals and _PRUNED not in states else None)
        sub = self._sub(group.batch)
        if sub is None:
            return
        if _PRUNED in states:
            sub.on_trial_complete(group.primary, None, error=False)  # -> Optuna PRUNED
        elif finals:
            # tokens to the batch size's target loss (or the final loss)
            tell_group(sub, group, finals, self.objectives, self._records, self.spec.budget_tokens)
        else:
            sub.on_trial_complete(group.primary, None, error=True)  # -> Optuna FAIL

    def groups_of(self, b: int) -> list[_Group]:
        """The groups of batch size ``b`` handed out so far, in the order they were opened."""
        return list({id(g): g for g in self.groups.values() if g.batch == b}.values())

    def _group_ended(self, group: _Group, objective: float | None) -> None:
        """Tell the strategy a group ended, with every group of its batch size once that batch size is done."""
        b = group.batch
        groups = self.groups_of(b)
        done = self.assigned[b] >= self.trials_for(b) and all(g.finished() for g in groups)
        self.strategy.group_ended(group, objective, groups if done else None, self._fastest_group)

    def attach_records(self, records: Any) -> None:
        """Attach ``records() -> list[TrialRecord]`` (the trials so far, from the driver's report log), so each
        study is told tokens to a target loss (:mod:`sweeps.search.objective`) and, under transfer, a batch
        size's best LR is its fastest group's at the fit's target losses
        (:func:`sweeps.search.transfer.fastest_to_targets`); without it, the final loss decides both."""
        self._records = records

    def selection_targets(self, curves: Sequence[Curve]) -> list[float]:
        """Where a batch size's fastest LR is chosen: the spec's ``targets``, else the declared ones, else (in the
        first wave) :func:`provisional_targets` of its ``curves``."""
        return list(self.spec.targets or self.precision_targets or provisional_targets(curves))

    def _fastest_group(self, groups: list[_Group]) -> _Group | None:
        if getattr(self, "_records", None) is None:
            return None
        try:
            by_id = curves_of(self._records, [t for g in groups for t in g.trial_ids])
            curves = [
                [by_id[t] for t in g.trial_ids if t in by_id and g.results.get(t, ("", None))[0] == _COMPLETE]
                for g in groups
            ]
            i = fastest_to_targets(curves, self.selection_targets([c for g in curves for c in g]))
        except Exception:
            log.exception("transfer: the trials' records could not be read; the lowest final loss picks the best LR")
            return None
        return groups[i] if i is not None else None

    # ---- state for Tuner.restore -----------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        subs = self._subs or {}
        d["_subs_ot_trials"] = {
            b: {tid: optuna_trial_id(t) for tid, t in optuna_search_trials(s).items()} for b, s in subs.items()
        }
        d["_subs_completed"] = {b: set(optuna_search_completed(s)) for b, s in subs.items()}
        # the samplers' state (their RNG): a restored sweep then asks for what the uninterrupted one would have
        d["_sampler_blobs"] = {
            **self._sampler_blobs,
            **{b: pickle.dumps(optuna_search_study(s).sampler) for b, s in subs.items()},
        }
        d["_subs"] = None
        d["scheduler"] = None  # re-attached by the driver
        d["_records"] = None  # likewise (attach_records, attach_precision)
        d["wave_policy"] = self.wave_policy.detached()
        return d

    def __setstate__(self, state: dict[str, Any]) -> None:
        old_layout = "strategy" not in state  # pickled before the strategy and the wave policy were composed
        self.__dict__.update(composed_state(state))
        if old_layout:  # the migration of a Tune folder rewrites such a pickle (sweeps.store.migrations)
            self.__dict__[OLD_LAYOUT_ATTR] = True

    def save(self, checkpoint_path: str) -> None:
        write_atomic(checkpoint_path, lambda f: pickle.dump(self._state(), f))

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            state = pickle.load(f)
        ot_trials = state.pop("_subs_ot_trials", {})
        completed = state.pop("_subs_completed", {})
        self.set_state(state)
        self._subs = None
        # Re-attach the Optuna trials that were asked before the interruption (they live in the RDB).
        for b, mapping in ot_trials.items():
            sub = self._sub(b)
            if sub is None:
                continue
            optuna_search_reattach(sub, mapping, completed.get(b, set()))

    def get_state(self) -> dict:
        return self._state()

    def set_state(self, state: dict) -> None:
        """Take ``state`` (:meth:`get_state`'s, of any revision: :func:`~sweeps.search.saved_state.composed_state`),
        keeping this searcher's attached scheduler, records and wave analysis."""
        policy = self.__dict__.get("wave_policy")
        attached = (policy._analyse, policy._report) if policy is not None else (None, None)
        # defaults for a state saved before the samplers, the fingerprint or the tokens-to-target objective
        self.__dict__.update(
            composed_state(
                {
                    "_sampler_blobs": {},
                    "fingerprint": None,
                    "objectives": {},
                    **state,
                    "scheduler": getattr(self, "scheduler", None),
                    "_records": getattr(self, "_records", None),
                }
            )
        )
        if attached != (None, None):
            self.wave_policy.attach(*attached)
