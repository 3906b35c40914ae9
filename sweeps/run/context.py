"""What one sweep carries through its run, and what it returns: plain values, made by the driver.

:class:`PreparedSweep` is everything the preflight resolved (``sweeps.run.prepare.prepare_sweep``, or a
resume's saved state), made once per sweep run; :class:`SweepRun` adds the live parts of the run (MLflow
tracker, ``sweep.json`` state, signals, concurrency) and travels through ``sweeps.run.driver``,
``execute`` and ``finish`` in one piece; :class:`SweepResult` is what :func:`sweeps.run.api.run_sweep`
returns. None of them is pickled into Tune's experiment or the sweep's files: those hold the spec and
plain values only, so saved state does not depend on these classes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeps.spec.statuses import SweepStatus

if TYPE_CHECKING:  # annotations only: importing this module (as ``sweeps.run.compare`` does) imports no workload
    from sweeps.launch.workload import WorkloadFacts
    from sweeps.run.signals import StopSignals
    from sweeps.settings import Settings
    from sweeps.spec import SweepSpec
    from sweeps.store.state import SweepState
    from sweeps.tracking.base import Tracker
    from workloads.api import WorkloadConfig

__all__ = ["PreparedSweep", "SweepResult", "SweepRun"]


@dataclass(frozen=True, kw_only=True)
class PreparedSweep:
    """One sweep, resolved and checked before anything is created.

    Attributes:
        spec: the spec with its paths made absolute and ``budget.sweep_flops``' trial plan applied
            (what ``OUT/spec.yaml`` holds).
        output: the output folder (absolute).
        sweep_id: the sweep id (:mod:`sweeps.spec.identity`).
        fingerprint: the fingerprint of the spec as given, which the sweep id is bound to (None in a
            resumed sweep older than the binding).
        tracking_uri: the MLflow tracking URI.
        storage_root: where Tune and Train keep state (``sweeps.store.state.storage_root``): ``str(output)``,
            or a shared folder or URI.
        workload: the spec's workload config (:func:`sweeps.launch.workload.workload_config`), built once here;
            the trials get it with their data inputs (:func:`sweeps.launch.workload.with_inputs`).
        facts: FLOPs per token and real tokens per sequence of that workload, each counted once, when
            first asked (:class:`sweeps.launch.workload.WorkloadFacts`).
        inputs: the content hashes of its inputs (:func:`sweeps.store.inputs.pin_inputs`), hashed once here;
            a resumed sweep's are those ``sweep.json`` pinned.
        settings: the ``CRITBATCH_*`` settings it runs with (:class:`sweeps.settings.Settings`), read once.
    """

    spec: SweepSpec
    output: Path
    sweep_id: str
    fingerprint: str | None
    tracking_uri: str
    storage_root: str
    workload: WorkloadConfig
    facts: WorkloadFacts
    inputs: dict[str, dict[str, Any]] | None = None
    settings: Settings

    @property
    def shared_storage(self) -> bool:
        """Whether Tune's state lives outside the output folder (``resources.storage_path``)."""
        return self.storage_root != str(self.output)


@dataclass(frozen=True, kw_only=True)
class SweepRun:
    """A sweep while it runs: what was prepared, and the live parts every step hands on.

    Attributes:
        prepared: the sweep (:class:`PreparedSweep`).
        tracker: where its events are recorded (:class:`sweeps.tracking.base.Tracker`; parent run started or
            attached).
        state: its ``OUT/sweep.json`` (changed in place as the run goes).
        stop: the signal handlers; a signal ends the run cleanly (status ``STOPPED``).
        concurrency: trials running at once (:func:`sweeps.launch.cluster.plan_resources`).
        show_progress: whether the live progress table is drawn.
        resume: continue the Tune run in the sweep's storage (``Tuner.restore``) if there is one.
    """

    prepared: PreparedSweep
    tracker: Tracker
    state: SweepState
    stop: StopSignals
    concurrency: int
    show_progress: bool
    resume: bool

    @property
    def spec(self) -> SweepSpec:
        return self.prepared.spec

    @property
    def output(self) -> Path:
        return self.prepared.output

    @property
    def local(self) -> bool:
        """Whether Tune's state is in the output folder (else on shared storage)."""
        return self.state.storage_root == str(self.output)


@dataclass(frozen=True, kw_only=True)
class SweepResult:
    """How a sweep (or a comparison) ended.

    Attributes:
        ok: False when the sweep FAILED (no trial completed, or the analysis could not run) or was STOPPED.
        status: ``SUCCEEDED``, ``FAILED`` or ``STOPPED`` (``sweeps.spec.statuses``).
        sweep_id: the sweep's id (a comparison's: the comparison id).
        cbs: ``OUT/cbs.json``'s content, or None when the sweep stopped before its analysis.
        output: the output folder.
        message: one line for the user ("" when there is nothing to say).
        exit_code: ``128 + signal`` when a signal stopped it, else None.
    """

    ok: bool
    status: str
    sweep_id: str
    cbs: dict[str, Any] | None
    output: str
    message: str
    exit_code: int | None

    @classmethod
    def stopped(cls, sweep_id: str, output: Path | str, message: str, exit_code: int | None) -> SweepResult:
        """A sweep stopped before its analysis (``ok`` False, no ``cbs``)."""
        return cls(
            ok=False,
            status=SweepStatus.STOPPED,
            sweep_id=sweep_id,
            cbs=None,
            output=str(output),
            message=message,
            exit_code=exit_code,
        )

    def to_dict(self) -> dict[str, Any]:
        """``{"ok", "status", "sweep_id", "cbs", "output", "message", "exit_code"}``, in that order (``cbs``
        not copied)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
