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
from typing import Any

import optuna
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from sweeps._compat import (
    optuna_search_completed,
    optuna_trial_id,
    optuna_search_reattach,
    optuna_search_study,
    optuna_search_trials,
)
from sweeps.spec import SweepSpec
from sweeps.files import write_atomic
from sweeps.search.objective import OBJECTIVE, TokensToTarget
from sweeps.search.waves import PrecisionWaves
from sweeps.search.transfer import (
    MAX_PROBE_OFFSET_OCTAVES,
    anchor_of,
    fastest_to_targets,
    lr_offsets_octaves,
    provisional_targets,
    start_centre,
    transfer_order,
)
from sweeps.search.space import LR_OFFSET, hyperparameters_for, search_space, study_storage, transfer_hyperparameters

__all__ = ["BatchSizeSearcher", "search_space", "hyperparameters_for", "transfer_hyperparameters", "OBJECTIVE",
           "LR_OFFSET"]

log = logging.getLogger(__name__)

#: Optuna user attribute of an enqueued ``search.initial_points`` trial: the point's index
INITIAL_POINT_ATTR = "critbatch.initial_point"
#: Optuna study user attribute: the fingerprint of the spec the sweep id is bound to
FINGERPRINT_ATTR = "critbatch.fingerprint"
#: Optuna user attribute of a trial enqueued by ``search.strategy: transfer``: its index among its batch size's
TRANSFER_POINT_ATTR = "critbatch.transfer_point"
#: study user attribute: how many initial points were enqueued (so a restored study does not enqueue them again)
INITIAL_POINTS_ENQUEUED_ATTR = "critbatch.initial_points_enqueued"


class _Group:
    """One Optuna suggestion, run once per seed."""

    def __init__(self, primary: str, batch: int, params: dict[str, Any], n_seeds: int,
                 initial_point: int | None = None):
        self.primary = primary
        self.batch = batch
        self.params = params
        self.n_seeds = n_seeds
        self.initial_point = initial_point
        self.budget_multiple = 1  # token reallocation: a re-run trains this many budgets
        self.trial_ids: list[str] = []
        self.results: dict[str, tuple[str, float | None]] = {}  # trial id -> (state, objective)

    def full(self) -> bool:
        return len(self.trial_ids) >= self.n_seeds

    def finished(self) -> bool:
        return len(self.results) >= self.n_seeds


class BatchSizeSearcher(TokensToTarget, PrecisionWaves, Searcher):
    """Tune searcher: batch sizes on a grid, Optuna (TPE) per batch size, seeds repeated.

    Args:
        spec: the sweep.
        storage_url: Optuna RDB storage URL (``sqlite:///OUT/optuna.db``).
        study_prefix: study names are ``{study_prefix}-B{batch}``.

        fingerprint: if given, recorded in each study (user attribute ``critbatch.fingerprint``).
        scheduler: the pruning scheduler in mode ``pause``: new trials start only when it says so
            (:meth:`~sweeps.pruning.halving.SuccessiveHalving.may_start`); None otherwise.

    Emits ``spec.n_trials`` configs, then ``Searcher.FINISHED``; with ``search.precision``, after those
    (a wave) it waits for them to end, asks the attached analysis (:meth:`attach_precision`) and either adds
    a wave of trials (:mod:`sweeps.search.precision`; ``waves`` keeps each wave's interval and what it added)
    or finishes, saying why in ``precision_outcome``. Each config holds
    ``batch_size_sequences``, ``seed``, ``group_id`` and the resolved hyperparameters, and
    ``initial_point`` (its index in ``search.initial_points``) when it is one.

    With ``search.strategy: transfer`` batch sizes are handed out in :func:`transfer_order`; one whose
    anchor has not finished waits (``suggest`` returns None, Tune asks again), and its study gets its
    trials' LR offsets and carried beta2 enqueued when it starts (:mod:`sweeps.search.transfer`); its
    centre, alpha and each finished batch size's best LR are kept in ``transfer_state``.
    """

    def __init__(self, spec: SweepSpec, storage_url: str, study_prefix: str, fingerprint: str | None = None,
                 scheduler: Any = None):
        super().__init__(metric=OBJECTIVE, mode="min")
        self.spec = spec
        self.storage_url = storage_url
        self.study_prefix = study_prefix
        self.fingerprint = fingerprint
        #: pickled samplers of a restored searcher, by batch size, until their study is opened again
        self._sampler_blobs: dict[int, bytes] = {}
        self.space = search_space(spec)
        self.batches = list(spec.search.batch_sizes_sequences)
        self.transfer = spec.search.strategy == "transfer"
        if self.transfer:
            self.batches = transfer_order(self.batches, spec.search.base_batch_size_sequences)
        #: transfer only: per batch size, ``{"centre_lr", "alpha", "anchor"}`` once started and ``"best_lr"``,
        #: ``"best_params"`` (its best group's sampled values) once its groups have all finished
        self.transfer_state: dict[int, dict[str, Any]] = {}
        self.quota = spec.search.trials_per_batch_size * len(spec.seeds)
        #: search.precision: extra groups handed to each batch size by later waves, and under transfer their LRs
        self.precision = spec.search.precision
        self.extra_groups: dict[int, int] = {}
        self.extra_lrs: dict[int, list[float]] = {}
        #: token reallocation (waves.py): extra groups' budget multiples, first wave's budgets, later waves' allowances
        self.extra_budget_multiples, self.budgets_first_wave, self.budgets_allowed = {}, 0.0, 0.0
        #: one entry per ended wave (:func:`sweeps.search.precision.wave_summary` plus ``added``)
        self.waves: list[dict[str, Any]] = []
        #: ``{"stopped_because": "met" | "max_trials" | "nothing_to_add" | "no_trial_completed" | "analysis_failed",
        #: ...}`` once the searcher stopped adding
        self.precision_outcome: dict[str, Any] | None = None
        #: the target losses the first wave declared (every later wave and cbs.json use them)
        self.precision_targets: list[float] | None = None
        self._analyse = None  # attached by the driver (attach_precision), never pickled
        self._report = None
        self._records = None  # attached by the driver (attach_records), never pickled
        #: per batch size, what its study is told (:mod:`sweeps.search.objective`): ``{"objective":
        #: "tokens_to_target" | "final_loss", "target_loss": nats | None}``, fixed when its first group ends
        self.objectives: dict[int, dict[str, Any]] = {}
        self.assigned: dict[int, int] = {b: 0 for b in self.batches}
        self.open_group: dict[int, _Group | None] = {b: None for b in self.batches}
        self.groups: dict[str, _Group] = {}  # tune trial id -> group
        self._subs: dict[int, OptunaSearch] | None = None
        self._rr = 0
        #: the pruning scheduler in mode "pause" (``EqualComputeScheduler``): it gates new trials (paused
        #: trials do not count as running) and says which trials it pruned while they were paused
        self.scheduler = scheduler

    def attach_scheduler(self, scheduler: Any) -> None:
        """Attach the pause-mode scheduler to a restored searcher (its pickled state leaves it out)."""
        self.scheduler = scheduler

    def _quota(self, b: int) -> int:
        return self.quota + self.extra_groups.get(b, 0) * len(self.spec.seeds)

    def exhausted(self) -> bool:
        """True once every batch size has been handed all its trials (of the waves so far)."""
        return all(self.assigned[b] >= self._quota(b) for b in self.batches)

    def _live(self) -> list[str]:
        return [t for t, g in self.groups.items() if t not in g.results]

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
            sub = OptunaSearch(space=self.space, metric=OBJECTIVE, mode="min", storage=storage, study_name=name,
                               sampler=sampler)
            self._prepare_study(optuna_search_study(sub), b)
            self._subs[b] = sub
        return self._subs[b]

    def _prepare_study(self, study: optuna.Study, b: int) -> None:
        """Record the spec's fingerprint and, in a new study, enqueue ``search.initial_points`` (in order;
        not under transfer, where :meth:`_enqueue_transfer_point` places each group)."""
        attrs = study.user_attrs
        if self.fingerprint and attrs.get(FINGERPRINT_ATTR) != self.fingerprint:
            study.set_user_attr(FINGERPRINT_ATTR, self.fingerprint)
        if self.transfer:  # each group's point is enqueued just before it is asked (suggest)
            return
        points = self.spec.search.initial_points
        if not points or attrs.get(INITIAL_POINTS_ENQUEUED_ATTR) or study.get_trials(deepcopy=False):
            return
        for i, p in enumerate(points):
            study.enqueue_trial({k: v for k, v in p.given().items() if k in self.space},
                                user_attrs={INITIAL_POINT_ATTR: i})
        study.set_user_attr(INITIAL_POINTS_ENQUEUED_ATTR, len(points))

    def _next_batch(self) -> int | None:
        if self.transfer:  # the first batch size, in transfer order, with trials left whose anchor has finished
            return next((b for b in self.batches if self.assigned[b] < self._quota(b) and self._ready(b)), None)
        n = len(self.batches)
        for i in range(n):
            b = self.batches[(self._rr + i) % n]
            if self.assigned[b] < self._quota(b):
                self._rr = (self._rr + i + 1) % n
                return b
        return None

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        if self.scheduler is not None and not self.exhausted() and not self.scheduler.may_start(self._live()):
            return None  # as many trials running as allowed (paused ones do not count): ask again later
        b = self._next_batch()
        if b is None and self.exhausted():
            ended = self._end_of_wave()
            if ended is None:
                return None  # a wave's trials still run
            if not ended:
                return Searcher.FINISHED
            b = self._next_batch()
        if b is None:
            return None  # transfer: waiting for an anchor to finish
        if self.transfer and b not in self.transfer_state:
            self._start_transfer(b)
        group = self.open_group[b]
        if group is None or group.full():
            sub = self._sub(b)
            if self.transfer:
                self._enqueue_transfer_point(sub, b)
            params = sub.suggest(trial_id) if sub is not None else {}
            if params is None:
                return None
            point = optuna_search_trials(sub)[trial_id].user_attrs.get(INITIAL_POINT_ATTR) if sub is not None else None
            group = _Group(trial_id, b, dict(params), len(self.spec.seeds), initial_point=point)
            group.budget_multiple = self._next_budget_multiple(b)  # before the group counts among b's
            group.stop_at_loss = self._next_stop_at_loss(b)
            self.open_group[b] = group
        seed = self.spec.seeds[len(group.trial_ids)]
        group.trial_ids.append(trial_id)
        self.groups[trial_id] = group
        self.assigned[b] += 1
        hp = self._group_hyperparameters(b, group)  # a new group's Optuna trial also records its LR (objective.py)
        point = getattr(group, "initial_point", None)
        stop, multiple = self.stop_at_loss(), getattr(group, "budget_multiple", 1)
        stop = (getattr(group, "stop_at_loss", None) or stop) if stop is not None else None  # a probe's own, if higher
        extra = {"initial_point": point, "stop_at_loss": stop,  # token reallocation: the stop, a re-run's budget
                 "budget_tokens": multiple * self.spec.budget_tokens if multiple > 1 else None}
        return {"batch_size_sequences": b, "seed": seed, "group_id": group.primary, **hp,
                **{k: v for k, v in extra.items() if v is not None}}

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
            group.results[trial_id] = ("FAIL", None)
        elif result is not None and result.get("pruned"):
            group.results[trial_id] = ("PRUNED", None)
        else:
            val = None if result is None else result.get(OBJECTIVE)
            ok = val is not None and math.isfinite(val)
            group.results[trial_id] = ("COMPLETE", float(val)) if ok else ("FAIL", None)
        if not group.finished():
            return
        states = [s for s, _ in group.results.values()]
        finals = {t: v for t, (s, v) in group.results.items() if s == "COMPLETE"}
        if self.transfer:
            self._record_transfer(group, sum(finals.values()) / len(finals) if finals and "PRUNED" not in states
                                  else None)
        sub = self._sub(group.batch)
        if sub is None:
            return
        if "PRUNED" in states:
            sub.on_trial_complete(group.primary, None, error=False)  # -> Optuna PRUNED
        elif finals:
            self._tell(sub, group, finals)  # tokens to the batch size's target loss (or the final loss)
        else:
            sub.on_trial_complete(group.primary, None, error=True)  # -> Optuna FAIL

    # ---- search.strategy: transfer ---------------------------------------------------------------

    def _groups_of(self, b: int) -> list[_Group]:
        return list({id(g): g for g in self.groups.values() if g.batch == b}.values())

    def _ready(self, b: int) -> bool:
        """Transfer: ``b`` may start (it is the first batch size, or its anchor has had every trial end)."""
        if b in self.transfer_state:
            return True
        anchor = anchor_of(b, self.batches)
        return anchor is None or "best_lr" in self.transfer_state.get(anchor, {})

    def _start_transfer(self, b: int) -> None:
        """Fix ``b``'s centre LR (:func:`sweeps.search.transfer.start_centre`) and the beta2 its trials carry (the
        first batch size's: see :mod:`sweeps.search.transfer`)."""
        anchor = anchor_of(b, self.batches)
        best = {a: st["best_lr"] for a, st in self.transfer_state.items() if "best_lr" in st}
        centre, alpha = start_centre(self.spec.search, b, anchor, best)
        carried = self._first_beta2() if anchor is None else dict(self.transfer_state[anchor]["carried"])
        self.transfer_state[b] = {"centre_lr": centre, "alpha": alpha, "anchor": anchor, "carried": carried}

    def _first_beta2(self) -> dict[str, Any]:
        """The searched beta2 dimension's value under transfer: the geometric middle of the half-life
        range, or the first of ``beta2.values`` (empty when beta2 is fixed)."""
        beta2 = self.spec.search.beta2
        if "beta2_half_life_tokens" in self.space:
            lo, hi = beta2.half_life_tokens
            return {"beta2_half_life_tokens": math.sqrt(lo * hi)}
        if "beta2" in self.space:
            return {"beta2": beta2.values[0]}
        return {}

    def _enqueue_transfer_point(self, sub: OptunaSearch, b: int) -> None:
        """Enqueue the point of ``b``'s next group: its LR offset by the group's index (the groups of ``b``
        handed out so far) and the carried beta2. Derived from the searcher's own state, so a searcher
        restored from an older save asks the same point again (an Optuna trial asked after that save is
        left RUNNING in its study)."""
        i, k = len(self._groups_of(b)), self.spec.search.trials_per_batch_size
        if i < k:
            offset = lr_offsets_octaves(k)[i]
        else:  # a search.precision probe at a chosen LR
            lr = self.extra_lrs[b][i - k]
            offset = min(max(math.log2(lr / self.transfer_state[b]["centre_lr"]), -MAX_PROBE_OFFSET_OCTAVES),
                         MAX_PROBE_OFFSET_OCTAVES)
        optuna_search_study(sub).enqueue_trial({LR_OFFSET: offset, **self.transfer_state[b]["carried"]},
                                               user_attrs={TRANSFER_POINT_ATTR: i})

    def _record_transfer(self, group: _Group, objective: float | None) -> None:
        """A group of ``group.batch`` ended: keep its batch size's best LR once every group has ended (a batch
        size whose trials all failed keeps its centre as its best LR)."""
        b = group.batch
        state = self.transfer_state.setdefault(b, {})
        if objective is not None and objective < state.get("best_objective", math.inf):
            state.update(best_objective=objective, best_params=dict(group.params),
                         best_group_lr=state["centre_lr"] * 2.0 ** float(group.params.get(LR_OFFSET, 0.0)))
        groups = self._groups_of(b)
        if self.assigned[b] >= self._quota(b) and all(g.finished() for g in groups):
            fastest = self._fastest_group(groups)
            if fastest is not None:  # what the fit uses: tokens to its target losses
                state.update(best_params=dict(fastest.params), best_by="tokens_to_targets",
                             best_group_lr=state["centre_lr"] * 2.0 ** float(fastest.params.get(LR_OFFSET, 0.0)))
            else:
                state["best_by"] = "final_loss"
            state["best_lr"] = state.get("best_group_lr", state["centre_lr"])

    def attach_records(self, records: Any) -> None:
        """Attach ``records() -> list[TrialRecord]`` (the trials so far, from the driver's report log), so each
        study is told tokens to a target loss (:mod:`sweeps.search.objective`) and, under transfer, a batch
        size's best LR is its fastest group's at the fit's target losses
        (:func:`sweeps.search.transfer.fastest_to_targets`); without it, the final loss decides both."""
        self._records = records

    def selection_targets(self, curves: list[tuple[list[float], list[float]]]) -> list[float]:
        """Where a batch size's fastest LR is chosen: the spec's ``targets``, else the declared ones, else (in the
        first wave) :func:`provisional_targets` of its ``curves``."""
        return list(self.spec.targets or getattr(self, "precision_targets", None) or provisional_targets(curves))

    def _fastest_group(self, groups: list[_Group]) -> _Group | None:
        if getattr(self, "_records", None) is None:
            return None
        try:
            by_id = self._curves([t for g in groups for t in g.trial_ids])
            curves = [[by_id[t] for t in g.trial_ids if t in by_id and g.results.get(t, ("", None))[0] == "COMPLETE"]
                      for g in groups]
            i = fastest_to_targets(curves, self.selection_targets([c for g in curves for c in g]))
        except Exception:  # noqa: BLE001 - unreadable records: the final loss decides, the sweep goes on
            log.exception("transfer: the trials' records could not be read; the lowest final loss picks the best LR")
            return None
        return groups[i] if i is not None else None

    # ---- state for Tuner.restore -----------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        subs = self._subs or {}
        d["_subs_ot_trials"] = {b: {tid: optuna_trial_id(t) for tid, t in optuna_search_trials(s).items()} for b, s in subs.items()}
        d["_subs_completed"] = {b: set(optuna_search_completed(s)) for b, s in subs.items()}
        # the samplers' state (their RNG): a restored sweep then asks for what the uninterrupted one would have
        d["_sampler_blobs"] = {**self._sampler_blobs,
                               **{b: pickle.dumps(optuna_search_study(s).sampler) for b, s in subs.items()}}
        d["_subs"] = None
        d["scheduler"] = None  # re-attached by the driver
        d["_analyse"] = d["_report"] = d["_records"] = None  # likewise (attach_precision, attach_records)
        return d

    def save(self, checkpoint_path: str) -> None:
        write_atomic(checkpoint_path, lambda f: pickle.dump(self._state(), f))

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            state = pickle.load(f)
        ot_trials = state.pop("_subs_ot_trials", {})
        completed = state.pop("_subs_completed", {})
        state["scheduler"] = getattr(self, "scheduler", None)
        state.setdefault("_sampler_blobs", {})  # saved before samplers were saved: the seed is shifted instead
        state.setdefault("fingerprint", None)
        state.setdefault("transfer", False)  # saved before search.strategy existed
        state.setdefault("transfer_state", {})
        state.setdefault("objectives", {})  # saved before the tokens-to-target objective
        state.update({k: v for k, v in self._precision_defaults().items() if k not in state})  # saved before search.precision
        state["_analyse"], state["_report"] = getattr(self, "_analyse", None), getattr(self, "_report", None)
        state["_records"] = getattr(self, "_records", None)
        self.__dict__.update(state)
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
        self.__dict__.update({"_sampler_blobs": {}, "fingerprint": None, "transfer": False, "transfer_state": {},
                              "objectives": {},
                              **self._precision_defaults(), **state, "scheduler": getattr(self, "scheduler", None),
                              "_analyse": getattr(self, "_analyse", None), "_report": getattr(self, "_report", None),
                              "_records": getattr(self, "_records", None)})

    def _precision_defaults(self) -> dict[str, Any]:
        return {"precision": None, "extra_groups": {}, "extra_lrs": {}, "waves": [], "precision_outcome": None,
                "precision_targets": None, "extra_budget_multiples": {}, "budgets_first_wave": 0.0,
                "budgets_allowed": 0.0}
