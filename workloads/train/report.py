"""What a trial reports at each token milestone: one typed record, the one definition of its names.

The loop (:func:`workloads.train.loop.run_loop`) makes a :class:`TrialReport` at every milestone; the Ray
adapter adds what the worker knows (start-up, threads, nodes) and sends :meth:`TrialReport.to_dict` to
Tune; the sweep reads the rows back (``OUT/reports/<trial id>.jsonl``, ``trials.json``) and logs the
fields marked ``mlflow`` as MLflow metrics (:data:`MLFLOW_METRICS`). Plain data: no torch.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = ["COMM_METRICS", "MLFLOW_METRICS", "ONCE_PER_ATTEMPT", "REPORT_KEYS", "TrialOutcome", "TrialReport"]


class TrialOutcome(enum.StrEnum):
    """A report's ``status``: how the trial stands at that milestone (lower case, as reports have always said)."""

    RUNNING = "running"
    COMPLETED = "completed"
    DIVERGED = "diverged"


def _metric(*, once: bool = False, comm: bool = False) -> Any:
    """A field logged to MLflow as a metric (``once``: one value per attempt; ``comm``: a communication counter)."""
    return field(default=None, metadata={"mlflow": True, "once": once, "comm": comm})


def _optional() -> Any:
    """A field present in a report only when set (None: absent from :meth:`TrialReport.to_dict`)."""
    return field(default=None, metadata={"optional": True})


@dataclass(frozen=True, kw_only=True)
class TrialReport:
    """One milestone report of a trial; the field order is the order of the report's keys.

    Attributes:
        tokens_seen: real tokens trained on so far, all workers (the MLflow step).
        step: optimizer steps taken.
        val_loss: held-out loss, nats per token (EMA weights for ``constant_ema``, the decayed branch
            for ``wsd``); NaN when the trial diverged before evaluating.
        val_loss_raw: held-out loss of the raw weights (None when ``val_loss`` is already theirs).
        train_loss: mean training loss over the steps since the last report (nats per token).
        flops: training FLOPs so far (``flops_per_token * tokens_seen``).
        flops_measurement: evaluation and decay-branch FLOPs so far.
        lr, beta2: the optimizer's LR and beta2 at the last step.
        batch_size_sequences_now: the global batch (sequences) of the current batch-size phase.
        tokens_per_s: training throughput since the last report (tokens / s, evaluation excluded).
        mfu: model FLOPs utilisation (None off CUDA or on an unknown device).
        b_simple, grad_sq_norm_est, trace_sigma_est: the gradient-noise-scale EMAs (McCandlish et al.
            2018, "An Empirical Model of Large-Batch Training", App. A), None until estimated.
        grad_norm: the last step's gradient norm.
        status: :class:`TrialOutcome` at this report.
        done: whether this is the trial's last report.
        objective: what the batch size's Optuna study minimises: ``val_loss``, or ``ln(vocab)`` if diverged.
        comm_bytes_per_step, comm_bytes_total, comm_time_s, syncs: this worker's communication in
            training (:class:`workloads.train.sync.CommCounters`); None in a report made without them.
        stopped_at_loss: True on the report where the trial reached ``eval.stop_at_loss``.
        steps_saved_vs_initial_batch: the last report of a batch-size warmup: steps saved (optimizer steps).
        first_step_unix_s: the attempt's first report: when its first optimizer step ended (Unix s).
        optimizer_state_bytes_per_param: the attempt's first report: optimizer state bytes per trainable
            parameter (absent when that step diverged and left the state empty).
        trainable_params: the attempt's first report: parameters the optimizer updates.
        startup_s, startup_ray_s: the attempt's first report (Ray adapter): trial start to the end of the
            first step, and the part before the worker function ran (s).
        torch_num_threads, deterministic_algorithms: the attempt's first report (Ray adapter): the worker's
            intra-op threads and deterministic flag (1.0 or 0.0).
        worker_rss_mb: the attempt's first report (Ray adapter): the worker's resident memory (MiB).
        worker_nodes: the Ray node id of every worker by rank, comma-separated (Ray adapter).
    """

    tokens_seen: int
    step: int
    val_loss: float = _metric()
    val_loss_raw: float | None = _metric()
    train_loss: float = _metric()
    flops: float = _metric()
    flops_measurement: float = _metric()
    lr: float = _metric()
    beta2: float = _metric()
    batch_size_sequences_now: int = _metric()
    tokens_per_s: float = _metric()
    mfu: float | None = _metric()
    b_simple: float | None = _metric()
    grad_sq_norm_est: float | None = _metric()
    trace_sigma_est: float | None = _metric()
    grad_norm: float = _metric()
    status: str = TrialOutcome.RUNNING
    done: bool = False
    objective: float | None = None
    comm_bytes_per_step: float | None = _metric(comm=True)
    comm_bytes_total: float | None = _metric(comm=True)
    comm_time_s: float | None = _metric(comm=True)
    syncs: int | None = _metric(comm=True)
    stopped_at_loss: bool | None = _optional()
    steps_saved_vs_initial_batch: int | None = _optional()
    first_step_unix_s: float | None = _optional()
    optimizer_state_bytes_per_param: float | None = _metric(once=True)
    trainable_params: int | None = _metric(once=True)
    startup_s: float | None = _metric(once=True)
    startup_ray_s: float | None = _metric(once=True)
    torch_num_threads: int | None = _metric(once=True)
    deterministic_algorithms: float | None = _metric(once=True)
    worker_rss_mb: float | None = _optional()
    worker_nodes: str | None = _optional()

    def to_dict(self) -> dict[str, Any]:
        """The report as sent to Tune and written to ``OUT/reports/*.jsonl``: every field in order; a field
        that is only sometimes reported (from ``stopped_at_loss`` on) only when set."""
        out: dict[str, Any] = {}
        for name in REPORT_KEYS:
            value = getattr(self, name)
            if value is not None or name in _ALWAYS:
                out[name] = value.value if isinstance(value, enum.Enum) else value  # plain str: no class in pickles
        return out

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> TrialReport:
        """Read a report row (a Tune result or a line of ``OUT/reports/*.jsonl``, of this version or an older
        one): the keys of other records (Tune's, the scheduler's) are ignored, missing ones are None.

        Raises:
            KeyError: a row without ``tokens_seen`` or ``step``.
        """
        return cls(**{name: row[name] for name in REPORT_KEYS if name in row})

    def with_worker(self, **fields: Any) -> TrialReport:
        """This report with the Ray adapter's fields (``startup_s``, ``worker_nodes``, ...) set."""
        return dataclasses.replace(self, **fields)


_FIELDS = dataclasses.fields(TrialReport)
#: every key a report may hold, in the order a report holds them
REPORT_KEYS: tuple[str, ...] = tuple(f.name for f in _FIELDS)
#: keys present in every report made by the loop (None included), the rest only when set
_ALWAYS = frozenset(f.name for f in _FIELDS if not f.metadata.get("optional") and not f.metadata.get("once"))
#: the report keys logged as MLflow metrics of a trial run (step = ``tokens_seen``)
MLFLOW_METRICS: tuple[str, ...] = tuple(f.name for f in _FIELDS if f.metadata.get("mlflow"))
#: metrics that hold one value per attempt (logged when they change, not at every milestone)
ONCE_PER_ATTEMPT: tuple[str, ...] = tuple(f.name for f in _FIELDS if f.metadata.get("once"))
#: a worker's communication counters (always 0 with one ddp worker)
COMM_METRICS: tuple[str, ...] = tuple(f.name for f in _FIELDS if f.metadata.get("comm"))
