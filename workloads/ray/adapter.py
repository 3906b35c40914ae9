"""The one place ``workloads`` touches Ray Train: the per-worker function of a ``TorchTrainer``.

Checkpoints: rank 0 writes the loop state (model, optimizer, weight EMA, noise-scale EMAs, data
position = step, RNG) and every report so far with each milestone report; a restarted worker group
resumes from ``ray.train.get_checkpoint()`` and first sends those reports again.

Placement: every report of a worker group carries ``worker_nodes``, the Ray node id of each of its
workers by world rank, comma-separated (gathered once when the group starts), so where a trial ran
is on record in ``OUT/reports/<trial id>.jsonl`` (a restarted group's reports name its new nodes).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import ray.train
import ray.train.torch
import torch

from workloads.config import TrialConfig, TrialRunContext, from_loop_config
from workloads.ray.compat import kv_get, train_storage_path
from workloads.train.determinism import make_deterministic
from workloads.train.hooks import milestone_hooks_from_env
from workloads.train.report import TrialReport
from workloads.train.state_file import out_of_space_error, save_state

__all__ = [
    "REPORTED_KEY",
    "STATE_FILE",
    "WORKER_NODES_KEY",
    "RungGate",
    "reaches_rung",
    "run_trial",
    "train_fn_per_worker",
    "wait_for_rung_decision",
    "worker_nodes",
]

STATE_FILE = "trial_state.pt"
#: the key of the checkpointed state that holds every report so far (sent again by a restored worker group)
REPORTED_KEY = "_reported_rows"
#: the report key naming the node of every worker (see the module docstring)
WORKER_NODES_KEY = "worker_nodes"  # TrialReport.worker_nodes

#: how long a worker waits at a rung for the scheduler's go before going on anyway (a lost signal costs
#: FLOPs, never the sweep)
RUNG_WAIT_TIMEOUT_S = 1800.0


def reaches_rung(cfg: TrialConfig, tokens_seen: float, previous_tokens: float) -> bool:
    """Whether the report at ``tokens_seen`` is the first at or past one of ``cfg.rung_gate.barrier_tokens``.

    Args:
        tokens_seen: this report's tokens seen.
        previous_tokens: the tokens seen at the trial's report before this one (0 for its first).

    Judged on the tokens the reports were actually made at, as the scheduler judges them: a report is
    rarely exactly at its milestone (a step that does not end on it, or passes several), and a gate
    judged on the nominal milestones let a trial that the scheduler pauses train on past its rung.
    """
    if cfg.rung_gate is None or not cfg.rung_gate.barrier_tokens:
        return False
    return any(
        previous_tokens < r * (1 - 1e-12) and r * (1 - 1e-12) <= tokens_seen for r in cfg.rung_gate.barrier_tokens
    )


def wait_for_rung_decision(
    key: str,
    tokens_seen: float,
    timeout_s: float = RUNG_WAIT_TIMEOUT_S,
    poll_s: float = 0.1,
    cancelled: Callable[[], bool] | None = None,
) -> bool:
    """Block until the Ray KV value under ``key`` (written by the sweep's scheduler) is >= ``tokens_seen``.

    Returns False if ``timeout_s`` passed first (the worker then goes on), or as soon as ``cancelled()``
    is true (a trial runner's trial that Tune paused or stopped meanwhile: the runner is freed).
    """
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        raw = kv_get(key)
        if raw is not None and float(raw) >= tokens_seen:
            return True
        if cancelled is not None and cancelled():
            return False
        time.sleep(poll_s)
    return False


class RungGate:
    """The rung gate of pruning mode ``pause`` as a trial's reports pass it (one per trial and worker).

    :meth:`reached` is called with every published report, in order, and says whether the report is the
    first at or past a rung (judged on the tokens the reports were made at, :func:`reaches_rung`); then the
    worker waits for the scheduler's decision (:meth:`wait`, or :meth:`after` for both at once).
    """

    def __init__(self, cfg: TrialConfig) -> None:
        self.cfg = cfg
        self.previous = 0.0  # the tokens seen at the report published last (a rung is judged against it)

    @property
    def key(self) -> str:
        """The key of the trial's rung gate ("" without one: then :meth:`reached` is always None)."""
        gate = self.cfg.rung_gate
        return gate.key if gate is not None else ""

    def reached(self, clean: dict[str, Any]) -> float | None:
        """The report's tokens seen if it reaches a rung where the worker must wait, else None."""
        tokens = float(clean.get("tokens_seen") or 0.0)
        gate, since = self.cfg.rung_gate, self.previous
        self.previous = max(since, tokens)
        if gate is None or not gate.key or clean.get("done") or not reaches_rung(self.cfg, tokens, since):
            return None
        return tokens

    def wait(self, tokens: float, *, cancelled: Callable[[], bool] | None = None, timeout_s: float) -> str:
        """Wait up to ``timeout_s`` for the scheduler's go at ``tokens``: ``"go"``, ``"cancelled"`` (the trial
        was cancelled meanwhile, :func:`wait_for_rung_decision`'s ``cancelled``) or ``"wait"`` (no answer yet)."""
        if wait_for_rung_decision(self.key, tokens, timeout_s=timeout_s, cancelled=cancelled):
            return "go"
        return "cancelled" if cancelled is not None and cancelled() else "wait"

    def after(self, clean: dict[str, Any]) -> None:
        """Wait at a rung if this report reaches one; after :data:`RUNG_WAIT_TIMEOUT_S` without a decision
        the worker goes on (a lost signal costs FLOPs, never the sweep)."""
        tokens = self.reached(clean)
        if tokens is None or self.wait(tokens, timeout_s=RUNG_WAIT_TIMEOUT_S) == "go":
            return
        import logging

        logging.getLogger(__name__).warning(
            "no rung decision for %s after %.0f s: going on", self.key, RUNG_WAIT_TIMEOUT_S
        )


def worker_nodes() -> str:
    """The Ray node id of every worker of this group by world rank, comma-separated (a collective:
    every rank calls it; one ``all_gather_object`` over the group's process group)."""
    import ray

    me = ray.get_runtime_context().get_node_id()
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return me
    ids: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(ids, me)
    return ",".join(str(i) for i in ids)


def _rss_mb() -> float | None:
    """This process's resident memory (MiB), or None without psutil: a trial runner's workers must not grow."""
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except Exception:  # noqa: BLE001 - psutil missing: the report goes without it
        return None


def _load_state(checkpoint: ray.train.Checkpoint | None) -> dict[str, Any] | None:
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as d:
        return torch.load(os.path.join(d, STATE_FILE), weights_only=False, map_location="cpu")


def train_fn_per_worker(config: dict[str, Any]) -> None:
    """Ray Train worker entry: run the trial's workload, reporting at token milestones.

    ``config`` is :func:`workloads.config.loop_config`: the trial's :class:`TrialConfig` and its
    :class:`TrialRunContext`. With the context's ``started_unix`` the first report of each attempt carries
    ``startup_s`` (trial start to the end of the first optimizer step, s) and ``startup_ray_s`` (the part
    before this function ran: Tune's and Ray Train's processes). Its ``torch_threads`` fixes the worker's
    intra-op threads (:func:`workloads.train.determinism.make_deterministic`, which also turns on
    deterministic algorithms on CPU); the first report of each attempt carries ``torch_num_threads`` and
    ``deterministic_algorithms`` (1.0 or 0.0) as the worker set them, and ``worker_rss_mb`` (the worker's
    resident memory, MiB, when psutil is installed). Its ``save_dir`` is where rank 0 saves the final
    Hugging Face checkpoint.
    """
    entered = time.time()
    cfg, context = from_loop_config(config)
    device = ray.train.torch.get_device()
    settings = make_deterministic(device, context.torch_threads)
    rank = ray.train.get_context().get_world_rank()
    nodes = worker_nodes()
    resume_state = _load_state(ray.train.get_checkpoint())
    gate = RungGate(cfg)

    def publish(clean: dict[str, Any], state: dict[str, Any] | None) -> None:
        if state is None:
            ray.train.report(clean)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                save_state(state, os.path.join(tmp, STATE_FILE))
                try:
                    ray.train.report(clean, checkpoint=ray.train.Checkpoint.from_directory(tmp))
                except Exception as exc:  # Ray Train's copy into the run's storage: a full disk says so
                    where = train_storage_path() or "the trial's Ray Train storage"
                    error = out_of_space_error(exc, f"the checkpoint to {where}", None)
                    if error is None:
                        raise
                    raise error from exc
        gate.after(clean)

    run_trial(
        cfg,
        context,
        device=device,
        settings=settings,
        rank=rank,
        nodes=nodes,
        entered=entered,
        resume_state=resume_state,
        publish=publish,
    )


def run_trial(
    cfg: TrialConfig,
    context: TrialRunContext,
    *,
    device: torch.device,
    settings: dict[str, Any],
    rank: int,
    nodes: str,
    entered: float,
    resume_state: dict[str, Any] | None,
    publish: Callable[[dict[str, Any], dict[str, Any] | None], None],
) -> None:
    """Run one trial's workload in this worker, handing every report (and rank 0's state) to ``publish``.

    Shared by the one-trial worker group (:func:`train_fn_per_worker`) and the trial runner
    (``workloads.ray.runner``). Every report so far travels in the checkpointed state, and a restored
    trial sends them all again first, whatever the pruning mode. Ray Train saves a checkpoint before Tune
    has the report that came with it: a driver that dies or is stopped in between (seen: SIGTERM, kill -9,
    two milestones under load) loses those reports, so MLflow and trials.json missed a milestone and, in
    pruning mode pause, the scheduler neither saw the trial reach its rung nor had the points its rung
    value needs. Replays that Tune already has are ignored downstream (the scheduler, the MLflow tracker
    and the trial records keep one row per milestone, by tokens seen).

    Args:
        context: its ``started_unix`` starts the first report's ``startup_s``; rank 0 saves the final
            Hugging Face checkpoint in its ``save_dir`` (ignored on other ranks).
        settings: :func:`workloads.train.determinism.make_deterministic`'s result (the first report says them).
        nodes: :func:`worker_nodes` (every report names them).
        entered: when this worker began the trial (Unix s; ``startup_ray_s`` ends there).
        resume_state: the trial's last checkpointed state, or None for a fresh start.
        publish: ``publish(clean_metrics, state_or_None)``: every rank, at every report.
    """
    resume_state = dict(resume_state) if resume_state is not None else None
    started = context.started_unix
    reported: list[dict[str, Any]] = list((resume_state or {}).pop(REPORTED_KEY, None) or [])

    def report(metrics: dict[str, Any], state: dict[str, Any] | None) -> None:
        made = TrialReport.from_dict(metrics)
        first_step = made.first_step_unix_s
        worker: dict[str, Any] = {"first_step_unix_s": None, WORKER_NODES_KEY: nodes}
        if first_step is not None and started is not None:
            worker.update(startup_s=first_step - started, startup_ray_s=entered - started)
        if first_step is not None:  # what this attempt's worker computed with (workloads.train.determinism)
            worker.update(
                torch_num_threads=settings["torch_num_threads"],
                deterministic_algorithms=float(settings["deterministic_algorithms"]),
                worker_rss_mb=_rss_mb(),
            )
        clean = {k: v for k, v in made.with_worker(**worker).to_dict().items() if v is not None}
        reported.append(clean)
        if state is not None:
            state = {**state, REPORTED_KEY: list(reported)}
        publish(clean, state)

    for row in list(reported):
        publish(row, None)

    from workloads.registry import get_workload

    get_workload(cfg.workload.name).train(
        cfg,
        device=device,
        report=report,
        resume_state=resume_state,
        save_dir=context.save_dir if rank == 0 else None,
        on_milestone=milestone_hooks_from_env(cfg),
    )
