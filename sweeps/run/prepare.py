"""A sweep's preflight, made once into a :class:`~sweeps.run.context.PreparedSweep`: every check that needs
neither Ray nor a new file, and everything the run resolves from the spec (paths, the budget's trial plan,
the sweep id, the tracking URI, the storage root, the workload config).

The driver (``sweeps.run.driver``) prepares each sweep it runs; a comparison (``sweeps.run.compare``)
prepares every arm first, so that an arm that cannot run stops the comparison before anything is created.
A resume rebuilds the same value from the sweep's saved state (:func:`resumed_sweep`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from sweeps.errors import InvalidInput
from sweeps.launch.workload import WorkloadFacts, workload_config
from sweeps.run.context import PreparedSweep
from sweeps.run.preflight import (
    check_data_files,
    check_optuna_storage,
    check_output_folder,
    check_tracking_uri,
    resolve_paths,
    spec_warnings,
    window_warnings,
)
from sweeps.settings import Settings
from sweeps.spec import SweepSpec
from sweeps.spec.identity import is_valid_sweep_id, local_tracking_uri, run_sweep_id, tracking_uri_source
from sweeps.spec.milestones import check_milestones
from sweeps.store.claims import STORAGE_BINDING_FILE, check_sweep_id_binding, read_storage_binding
from sweeps.store.inputs import check_inputs_unchanged, pin_inputs
from sweeps.store.state import SweepState, storage_root
from sweeps.tracking import schema

__all__ = ["prepare_sweep", "resumed_sweep"]

log = logging.getLogger(__name__)


def prepare_sweep(
    spec: SweepSpec,
    output: Path,
    *,
    tracking_uri: str | None = None,
    sweep_id: str | None = None,
    fingerprint: str | None = None,
    settings: Settings | None = None,
) -> PreparedSweep:
    """Check ``spec`` for a run into ``output`` and resolve what the run needs; nothing is created.

    Args:
        spec: the spec as given (no ``arms``: a comparison prepares each arm's spec).
        output: the output folder (made absolute here).
        tracking_uri: the MLflow tracking URI given (``--tracking-uri``); default the spec's.
        sweep_id: the sweep id given; default ``NAME-TIMESTAMP-hex`` (``sweeps.spec.identity.run_sweep_id``).
        fingerprint: the fingerprint the sweep id is bound to; default ``spec.fingerprint()``.
        settings: the ``CRITBATCH_*`` settings (Optuna storage, shared storage path); default: from the environment.

    Returns:
        the :class:`~sweeps.run.context.PreparedSweep` (paths resolved, budget planned, workload config built).

    Raises:
        InvalidInput: a batch size whose step passes several milestones (``sweeps.spec.milestones.check_milestones``),
            bad data, a tracking URI MLflow would refuse, an output folder that holds (or is being claimed by)
            another sweep, a bad sweep id, a sweep id bound to another spec's fingerprint, a sweep id whose
            shared storage root records other inputs (a retried job whose tokenizer, corpus, model config or
            checkpoint changed: :func:`sweeps.store.inputs.check_inputs_unchanged`), an Optuna storage that
            cannot be used.
    """
    fingerprint = fingerprint if fingerprint is not None else spec.fingerprint()  # of the spec as given
    hf_config_from = spec.model.hf_config if isinstance(spec.model.hf_config, str) else None  # read by resolve_paths
    check_milestones(spec)
    facts = check_data_files(spec)
    for warning in spec_warnings(spec) + window_warnings(
        spec, facts
    ):  # validate prints them too; a run should not hide them
        log.warning(warning)
    spec = resolve_paths(spec)
    workload = workload_config(spec)  # the budget plan changes no section the workload reads
    accounting = WorkloadFacts(spec, workload)
    spec = _plan_budget(spec, accounting)
    output = Path(output).expanduser().resolve()
    check_output_folder(output)
    sweep_id = sweep_id or run_sweep_id(spec.name)
    if not is_valid_sweep_id(sweep_id):
        raise InvalidInput(f"--sweep-id {sweep_id!r}: use letters, digits, '.', '_' and '-' (at most 128)")
    uri = local_tracking_uri(spec, tracking_uri)
    check_tracking_uri(uri, source=tracking_uri_source(spec, tracking_uri))
    settings = settings or Settings.from_env()
    if settings.optuna_storage:
        check_optuna_storage(settings.optuna_storage, source="CRITBATCH_OPTUNA_STORAGE")
    root = storage_root(spec, output, sweep_id, settings)
    shared = root != str(output)
    check_sweep_id_binding(
        sweep_id,
        fingerprint,
        storage_root=root if shared else None,
        mlflow_parents=_mlflow_parents(uri, spec.experiment_name, sweep_id),
        optuna_storage=settings.optuna_storage,
    )
    bound = read_storage_binding(root) if shared else None
    recorded = (bound or {}).get("inputs")  # a retried job: the sweep's start is on the shared storage root
    inputs = pin_inputs(spec, hf_config_from=hf_config_from, missing_ok=recorded is not None)
    if recorded is not None:
        check_inputs_unchanged(
            recorded,
            inputs,
            since=f"sweep {sweep_id!r} started (recorded in {root}/{STORAGE_BINDING_FILE})",
            remedy="put the originals back to resume it, or run with another --sweep-id",
        )
    return PreparedSweep(
        spec=spec,
        output=output,
        sweep_id=sweep_id,
        fingerprint=fingerprint,
        tracking_uri=uri,
        storage_root=root,
        workload=workload,
        facts=accounting,
        inputs=inputs,
        settings=settings,
    )


def resumed_sweep(spec: SweepSpec, output: Path, state: SweepState, settings: Settings) -> PreparedSweep:
    """The :class:`~sweeps.run.context.PreparedSweep` of a started sweep: its resolved spec (``OUT/spec.yaml``)
    and its saved state (``OUT/sweep.json``, whose pinned inputs it carries), run with ``settings``; nothing
    is checked here.

    Raises:
        InvalidInput: see :func:`sweeps.launch.workload.workload_config`.
    """
    workload = workload_config(spec)
    return PreparedSweep(
        spec=spec,
        output=Path(output),
        sweep_id=state.sweep_id,
        fingerprint=state.fingerprint,
        tracking_uri=state.tracking_uri,
        storage_root=state.storage_root,
        workload=workload,
        facts=WorkloadFacts(spec, workload),
        inputs=state.inputs,
        settings=settings,
    )


def _plan_budget(spec: SweepSpec, accounting: WorkloadFacts) -> SweepSpec:
    """The spec with the trials per batch size that fit ``budget.sweep_flops`` (unchanged without one).

    Raises:
        InvalidInput: the budget cannot pay for one full trial per batch size and seed.
    """
    if spec.budget.sweep_flops is None:
        return spec
    from sweeps.search.budget import apply_plan, plan_trials

    plan = plan_trials(spec, accounting.flops()[0])
    if plan.reduced:
        log.warning(
            "budget.sweep_flops %.3g fits %d trial(s) per batch size (the spec asks for %d): planning %d trials",
            spec.budget.sweep_flops,
            plan.trials_per_batch_size,
            spec.search.trials_per_batch_size,
            plan.n_trials,
        )
    return apply_plan(spec, plan)


def _mlflow_parents(uri: str, experiment: str, sweep_id: str) -> list[tuple[str, str | None]]:
    """``(run id, critbatch.fingerprint tag)`` of the MLflow parent runs of a sweep id; [] when the store
    does not exist yet or cannot be read (starting the parent run then says why)."""
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :].split("?", 1)[0]).is_file():
        return []
    from mlflow.tracking import MlflowClient

    from sweeps.tracking.writer import configure_mlflow_env

    configure_mlflow_env()
    try:
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            return []
        runs = client.search_runs(
            [exp.experiment_id],
            filter_string=(
                f"tags.`{schema.TAG_SWEEP_ID}` = '{sweep_id}' and tags.`{schema.TAG_ROLE}` = '{schema.ROLE_SWEEP}'"
            ),
        )
    except Exception:  # noqa: BLE001
        return []
    return [(r.info.run_id, r.data.tags.get(schema.TAG_FINGERPRINT)) for r in runs]
