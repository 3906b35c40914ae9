"""In-memory stand-ins for the Ray job server and the MLflow reader's reads, behind the real ``SweepJobs``.

A module of its own (not conftest) so that module-level test code, such as the schemathesis
schema or a parametrize list, can use them; also the tiny spec every service test submits
(:func:`tiny_spec`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

__all__ = ["FakeRayJobs", "FakeReader", "cluster_spec", "fake_run", "tiny_spec"]


class FakeRayJobs:
    """The subset of ``JobSubmissionClient`` that ``SweepJobs`` uses, in memory."""

    def __init__(self) -> None:
        from ray.job_submission import JobStatus

        self.JobStatus = JobStatus
        self.jobs: dict[str, SimpleNamespace] = {}
        self.submitted: list[dict[str, Any]] = []
        self.logs: dict[str, str] = {}
        self.stop_calls: list[str] = []
        self.clock = 1_700_000_000_000

    def add(
        self,
        sweep_id: str,
        status: str = "RUNNING",
        *,
        metadata: dict[str, str] | None = None,
        message: str | None = None,
        exit_code: int | None = None,
    ) -> SimpleNamespace:
        self.clock += 1000
        md = {
            "critbatch.sweep_id": sweep_id,
            "critbatch.name": sweep_id,
            "critbatch.experiment": "exp",
            "critbatch.tracking_uri": "http://mlflow.invalid",
            "critbatch.trials_planned": "2",
            "critbatch.fingerprint": "f" * 10,
        }
        md.update(metadata or {})
        job = SimpleNamespace(
            submission_id=sweep_id,
            status=self.JobStatus(status),
            metadata=md,
            message=message,
            start_time=self.clock,
            end_time=None,
            driver_exit_code=exit_code,
            entrypoint="",
        )
        self.jobs[sweep_id] = job
        return job

    def _missing(self, job_id: str) -> RuntimeError:
        return RuntimeError(f"Request failed with status code 404: Job {job_id} does not exist.")

    def get_job_info(self, job_id: str) -> SimpleNamespace:
        if job_id not in self.jobs:
            raise self._missing(job_id)
        return self.jobs[job_id]

    def submit_job(self, *, entrypoint: str, submission_id: str, runtime_env: dict, metadata: dict) -> str:
        if submission_id in self.jobs:
            raise RuntimeError(
                f"Request failed with status code 500: Job with submission_id {submission_id} already exists."
            )
        self.submitted.append(
            dict(
                entrypoint=entrypoint,
                submission_id=submission_id,
                runtime_env=runtime_env,
                metadata=metadata,
                files=sorted(
                    str(p.relative_to(runtime_env["working_dir"]))
                    for p in Path(runtime_env["working_dir"]).rglob("*")
                    if p.is_file()
                ),
            )
        )
        job = self.add(submission_id, "PENDING", metadata=metadata)
        job.entrypoint = entrypoint
        return submission_id

    def list_jobs(self) -> list[SimpleNamespace]:
        return list(self.jobs.values()) + [
            SimpleNamespace(
                submission_id="not-a-sweep",
                status=self.JobStatus("RUNNING"),
                metadata={},
                message=None,
                start_time=1,
                end_time=None,
                driver_exit_code=None,
            )
        ]

    def get_job_logs(self, job_id: str) -> str:
        if job_id not in self.jobs:
            raise self._missing(job_id)
        return self.logs.get(job_id, "")

    def stop_job(self, job_id: str) -> bool:
        if job_id not in self.jobs:
            raise self._missing(job_id)
        self.stop_calls.append(job_id)
        job = self.jobs[job_id]
        if job.status.is_terminal():
            return False
        job.status = self.JobStatus("STOPPED")
        return True


def fake_run(
    run_id: str,
    *,
    role: str,
    sweep_id: str,
    status: str = "RUNNING",
    tag_status: str = "RUNNING",
    metrics: dict[str, float] | None = None,
    params: dict[str, str] | None = None,
    tags: dict[str, str] | None = None,
    experiment_id: str = "1",
) -> SimpleNamespace:
    all_tags = {
        "critbatch.sweep_id": sweep_id,
        "critbatch.role": role,
        "critbatch.status": tag_status,
        "critbatch.trial_id": run_id if role == "trial" else "",
    }
    all_tags.update(tags or {})
    return SimpleNamespace(
        info=SimpleNamespace(run_id=run_id, status=status, experiment_id=experiment_id),
        data=SimpleNamespace(tags=all_tags, params=params or {}, metrics=metrics or {}),
    )


class FakeReader:
    """The reading subset of ``sweeps.tracking.reader.MlflowReader`` that ``SweepJobs`` uses, over
    in-memory runs. It writes nothing: closing an ended job's orphan runs
    (``MlflowReader.close_orphans``) is tested against a real MLflow store (``svc_store``), so a
    sweep given to this fake that would need it is a test bug, reported as an AttributeError
    (``mlflow_error`` in the status)."""

    def __init__(self) -> None:
        self.parents: dict[str, SimpleNamespace] = {}
        self.trial_runs: dict[str, list[SimpleNamespace]] = {}
        self.artifacts: dict[str, Any] = {}
        self.fail_with: Exception | None = None

    def __call__(self, uri: str) -> FakeReader:
        if self.fail_with is not None:
            raise self.fail_with
        return self

    def experiment_ids(self, name: str | None) -> list[str]:
        return ["1"]

    def experiment_deleted(self, name: str | None) -> bool:
        return False

    def parent(self, sweep_id: str, exp_ids: list[str]) -> SimpleNamespace | None:
        return self.parents.get(sweep_id)

    def trials(self, sweep_id: str, exp_ids: list[str]) -> list[SimpleNamespace]:
        return list(self.trial_runs.get(sweep_id, []))

    def load_json_artifact(self, run_id: str, path: str) -> Any:
        return self.artifacts.get(run_id)


#: The smallest spec the service tests submit (its data path is relative to the repo root, which the
#: tests serve as ``CRITBATCH_DATA_DIR``).
_TINY_SPEC = {
    "name": "tiny",
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 4, "context_length_tokens": 32},
    "data": {"path": "data/tinyshakespeare/input.txt"},
    "budget_tokens": 8192,
    "schedule": {"warmup_tokens": 1024},
    "eval": {"milestones": 4, "eval_tokens": 1024},
    "search": {"batch_sizes_sequences": [4, 8], "base_lr": 0.003, "base_batch_size_sequences": 4},
}


def tiny_spec(**over: Any) -> dict[str, Any]:
    """A fresh copy of the tiny spec (a plain dict); each keyword sets a section, a dict merged
    into a section that is one (``tiny_spec(tracking={"uri": ...})``)."""
    d = copy.deepcopy(_TINY_SPEC)
    for k, v in over.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) and isinstance(d.get(k), dict) else v
    return d


def cluster_spec(name: str, *, cpus_per_worker: float = 0.5, **over: Any) -> dict[str, Any]:
    """The tiny spec as the live test cluster runs it: Llama, one trial (one batch size, 4
    sequences: a sweep's plumbing needs no second one), one worker with ``cpus_per_worker`` CPUs,
    no retries; named ``name``. Each keyword replaces a whole section."""
    d = tiny_spec(
        name=name,
        model={"family": "llama"},
        schedule={"ema_half_life_tokens": 1024},
        search={"batch_sizes_sequences": [4], "base_batch_size_sequences": 4, "trials_per_batch_size": 1},
        resources={
            "workers_per_trial": 1,
            "cpus_per_worker": cpus_per_worker,
            "max_concurrent_trials": 1,
            "max_failures": 0,
        },
    )
    d.update(over)
    return d
