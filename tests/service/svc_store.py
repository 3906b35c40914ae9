"""A sweep's runs written into a real MLflow store (``mlflow_uri``: a copy of the suite's migrated
template), laid out as the driver leaves them: one parent run (``critbatch.role`` sweep) and its
trial child runs, each tagged with the sweep id and a ``critbatch.status``.

For the tests of what the real reader (``sweeps.tracking.reader.MlflowReader``) and ``SweepJobs``
do with them, such as closing the runs an ended job left RUNNING.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SeededSweep", "seed_sweep"]


@dataclass
class SeededSweep:
    """What :func:`seed_sweep` wrote: the client, the experiment and the run ids."""

    client: Any
    experiment_id: str
    parent_id: str
    trial_ids: dict[str, str] = field(default_factory=dict)  # critbatch.trial_id -> run id

    def run(self, trial: str | None = None) -> Any:
        """The parent run (no ``trial``) or trial ``trial``'s run, read again."""
        return self.client.get_run(self.parent_id if trial is None else self.trial_ids[trial])


def seed_sweep(
    uri: str,
    sweep_id: str,
    trials: dict[str, tuple[str, str, dict[str, float] | None]],
    *,
    experiment: str = "exp",
    planned: int = 2,
    parent: tuple[str, str] = ("RUNNING", "RUNNING"),
    artifacts: dict[str, Any] | None = None,
) -> SeededSweep:
    """Write sweep ``sweep_id`` into the SQLite store ``uri``: a parent run (``parent``: its run
    status and ``critbatch.status`` tag) and one child run per entry of ``trials`` (``trial_id ->
    (run status, critbatch.status tag, metrics)``); a run status other than RUNNING ends the run
    with it. ``artifacts`` (``name -> JSON``) are logged on the parent. The experiment's artifacts
    go beside the database, never to the cwd's ``mlruns``."""
    from mlflow import MlflowClient

    c = MlflowClient(uri)
    exp = c.get_experiment_by_name(experiment)
    exp_id = (
        exp.experiment_id
        if exp is not None
        else c.create_experiment(
            experiment, artifact_location=(Path(uri[len("sqlite:///") :]).parent / "artifacts").as_uri()
        )
    )
    base = {"critbatch.sweep_id": sweep_id}
    run = c.create_run(
        exp_id,
        run_name=sweep_id,
        tags={
            **base,
            "critbatch.role": "sweep",
            "critbatch.status": parent[1],
            "critbatch.trials_planned": str(planned),
        },
    )
    pid = run.info.run_id
    for name, value in (artifacts or {}).items():
        c.log_dict(pid, value, name)
    out = SeededSweep(c, exp_id, pid)
    for trial_id, (status, tag, metrics) in trials.items():
        r = c.create_run(
            exp_id,
            run_name=trial_id,
            tags={
                **base,
                "mlflow.parentRunId": pid,
                "critbatch.role": "trial",
                "critbatch.trial_id": trial_id,
                "critbatch.status": tag,
            },
        )
        for k, v in (metrics or {}).items():
            c.log_metric(r.info.run_id, k, v, step=100)
        c.log_param(r.info.run_id, "batch_size_sequences", "4")
        if status != "RUNNING":
            c.set_terminated(r.info.run_id, status)
        out.trial_ids[trial_id] = r.info.run_id
    if parent[0] != "RUNNING":
        c.set_terminated(pid, parent[0])
    return out
