"""Local critical batch size by branched training (Merrill et al. 2025, arXiv 2505.23971, section 3.1).

From checkpoints of a base run at batch ``B0`` taken at several points of its training, each branch
continues with batch ``k * B0``, learning rate ``sqrt(k) * lr`` (Adam) and beta2 by the token
half-life rule, for a fixed window of tokens (and the base run's LR warmup, not one of its own).
The local CBS at that point is ``k* * B0`` with
``k* = max k such that L_k <= L_j + epsilon for every j < k`` (methodology note section 5.2).

Deviation from the paper, stated in ``branch.json``: ``L_k`` is the validation loss on the sweep's
fixed held-out set at the end of the window (the paper smooths the training loss with an EMA); on
corpora this small the fixed validation set is the less noisy of the two.

Branches run as single-worker Ray tasks (no Train worker group per branch, so a branch costs its
training time, not a worker-group start), and their FLOPs are logged as ``flops_measurement``,
apart from the sweep's trials.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, cast

from sweeps.analysis.result import with_sweep_fields
from sweeps.errors import InvalidInput
from sweeps.files import write_json
from sweeps.spec import BranchSpec, SweepSpec
from sweeps.spec.result import CbsResult
from sweeps.spec.statuses import SweepStatus
from sweeps.tracking.schema import (
    MLFLOW_RUN_FAILED,
    MLFLOW_RUN_FINISHED,
    PARAM_BATCH_SIZE_SEQUENCES,
    ROLE_BRANCH,
    ROLE_BRANCH_SWEEP,
    TAG_PARENT_RUN_ID,
    TAG_ROLE,
    TAG_STATUS,
)
from workloads.api import TrialOutcome, beta2_from_half_life, get_workload, replace, warmup_length_tokens

__all__ = ["local_cbs_multiplier", "run_branching"]


def local_cbs_multiplier(losses: dict[float, float], epsilon: float) -> float | None:
    """``k* = max k such that L_k <= L_j + epsilon for all j < k`` (Merrill et al. 2025, section 3.1).

    Args:
        losses: branch multiplier ``k`` -> loss at the end of the window (non-finite: diverged).
        epsilon: tolerance in nats.

    Returns:
        ``k*``, or None when no branch has a finite loss. The smallest ``k`` is always accepted.
    """
    ks = sorted(k for k, v in losses.items() if v is not None and math.isfinite(v))
    if not ks:
        return None
    best = ks[0]
    for i, k in enumerate(ks):
        if all(losses[k] <= losses[j] + epsilon for j in ks[:i]):
            best = k
    return best


def _base_hyperparameters(spec: SweepSpec, b0: int, from_run_id: str | None, client) -> dict[str, Any]:
    from sweeps.search.searcher import hyperparameters_for

    if from_run_id is None or client is None:
        sampled: dict[str, Any] = {}
        if spec.search.beta2.half_life_tokens is not None:
            lo, hi = spec.search.beta2.half_life_tokens
            sampled["beta2_half_life_tokens"] = math.sqrt(lo * hi)
        lo_m, hi_m = spec.search.lr_multiplier
        sampled["lr_multiplier"] = math.sqrt(lo_m * hi_m)
        return hyperparameters_for(spec, b0, sampled)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(from_run_id, "cbs.json", tmp)
        except Exception as exc:  # noqa: BLE001
            raise InvalidInput(f"--from {from_run_id}: no cbs.json artifact on that MLflow run ({exc})") from None
        cbs = CbsResult.model_validate(json.loads(Path(path).read_text()))
    rows = cbs.per_batch or []
    if not rows:
        raise InvalidInput(f"--from {from_run_id}: its sweep has no completed batch size")
    row = min(rows, key=lambda r: abs(math.log(r.batch_size_sequences / b0)))
    hp = dict(row.best_config_at_budget or {})
    # carry the tuned config to B0 with the square-root rule and the token half-life
    hp["lr"] = hp["lr"] * math.sqrt(b0 / row.batch_size_sequences)
    hp["beta2"] = beta2_from_half_life(hp["beta2_half_life_tokens"], b0, spec.model.context_length_tokens)
    return hp


def run_branching(
    spec: SweepSpec,
    output: Path,
    *,
    tracking_uri: str | None = None,
    from_run_id: str | None = None,
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Run the base run and its branches; write ``OUT/branch.json`` and log MLflow child runs.

    With ``from_run_id`` (a sweep's parent MLflow run), the base run uses that sweep's best
    configuration near ``B0`` and the branch runs become children of that run; otherwise a new
    parent run (role ``branch``) is created in the sweep's experiment.

    Returns:
        ``{"local_cbs": [{"tokens_seen", "k_star", "local_cbs_sequences", "losses"}...], ...}``.

    Raises:
        InvalidInput: a pretraining spec is required; multipliers that do not give whole batches.
    """
    from mlflow.tracking import MlflowClient

    from sweeps.run.preflight import check_data_files
    from sweeps.spec.identity import local_tracking_uri
    from sweeps.tracking.writer import configure_mlflow_env

    train_in_process = get_workload(spec.workload).train_in_process
    if train_in_process is None:
        raise InvalidInput("branching needs a pretraining spec (workload: pretrain)")
    if spec.resources.parallelism != "ddp":
        raise InvalidInput(
            "resources.parallelism: branching runs each branch in one process; use ddp, not "
            f"{spec.resources.parallelism}"
        )
    check_data_files(spec)
    br = spec.branch or BranchSpec()
    b0 = br.base_batch_size_sequences or spec.search.base_batch_size_sequences
    bad = [k for k in br.multipliers if abs(k * b0 - round(k * b0)) > 1e-9 or round(k * b0) < 1]
    if bad:
        raise InvalidInput(f"branch.multipliers {bad} x base batch {b0} are not whole batch sizes")
    _check_window(br, b0, spec.model.context_length_tokens)
    output = Path(output).expanduser().resolve()
    output.mkdir(parents=True, exist_ok=True)
    states_dir = output / "branch_states"
    states_dir.mkdir(exist_ok=True)
    configure_mlflow_env()
    client = MlflowClient(local_tracking_uri(spec, tracking_uri))
    hp = _base_hyperparameters(spec, b0, from_run_id, client)
    step_tokens = b0 * spec.model.context_length_tokens
    points = sorted({int(round(f * spec.budget_tokens / step_tokens)) * step_tokens for f in br.points_fraction})
    base, results = _train_base_and_branches(spec, br, b0, hp, points, states_dir, train_in_process, ray_address)

    series = [_local_cbs_at(p, br, b0, results) for p in points]
    flops_branches = sum(
        (r["reports"][-1]["tokens_seen"] - p) * r["flops_per_token"] for (p, _), r in results.items() if r["reports"]
    )
    flops_base = (base["reports"][-1]["tokens_seen"] * base["flops_per_token"]) if base["reports"] else 0.0
    parent = _log_branches(client, spec, br, b0, results, from_run_id, flops_branches + flops_base)
    out = {
        "base_batch_size_sequences": b0,
        "base_hyperparameters": hp,
        "window_tokens": br.window_tokens,
        "epsilon": br.epsilon,
        "multipliers": list(br.multipliers),
        "loss_used": "validation loss (raw weights) at the end of the window",
        "flops_measurement": flops_branches + flops_base,
        "local_cbs": series,
        "mlflow_parent_run_id": parent,
    }
    write_json(output / "branch.json", out)
    if (output / "cbs.json").is_file():
        _add_local_cbs(output / "cbs.json", series)
    return out


def _add_local_cbs(cbs_path: Path, series: list[dict[str, Any]]) -> None:
    """Set ``local_cbs`` of the sweep's ``cbs.json`` at ``cbs_path`` to ``series`` (one entry per branch point, as
    :func:`run_branching` returns them), leaving the rest of the file as it was."""
    cbs = CbsResult.model_validate(json.loads(cbs_path.read_text()))
    write_json(cbs_path, with_sweep_fields(cbs, local_cbs=series).to_json_dict())


def _check_window(br: BranchSpec, b0: int, context_length_tokens: int) -> None:
    """Refuse a window that some branch cannot end on: a branch stops after the first optimizer step at or
    past the window's end, so with a window that is not a multiple of its step (``k x B0 x T`` tokens) it
    trains longer than the others, and ``k*`` would compare losses taken at different tokens.

    Raises:
        InvalidInput: naming each such multiplier, its step in tokens, and the least window that fits all.
    """
    steps = {k: int(round(k * b0)) * context_length_tokens for k in br.multipliers}
    off = {k: st for k, st in steps.items() if br.window_tokens % st}
    if off:
        fit = math.lcm(*steps.values())
        raise InvalidInput(
            f"branch.window_tokens {br.window_tokens} is not a multiple of the optimizer step of multiplier(s) "
            + ", ".join(f"{k:g} ({st} tokens per step)" for k, st in off.items())
            + f": those branches would stop past the window's end and their losses be compared at other tokens; "
            f"use a multiple of {fit} tokens"
        )


def _train_base_and_branches(
    spec: SweepSpec,
    br: BranchSpec,
    b0: int,
    hp: dict[str, Any],
    points: list[int],
    states_dir: Path,
    train_in_process,
    ray_address: str | None,
) -> tuple[dict[str, Any], dict[tuple[int, float], dict[str, Any]]]:
    """Train the base run at ``B0`` (saving its state at each positive point), then every branch as a
    Ray task; returns ``(base result, {(point, k): branch result})`` (``Workload.train_in_process``)."""
    import ray

    from sweeps.launch.cluster import ray_session
    from sweeps.launch.trainable import trial_config
    from sweeps.run.preflight import resolve_data_path
    from sweeps.search.searcher import hyperparameters_for

    T = spec.model.context_length_tokens
    step_tokens = b0 * T
    base_warmup_tokens = warmup_length_tokens(spec.schedule.warmup_tokens, spec.schedule.warmup_min_steps, step_tokens)
    data_path = resolve_data_path(spec)
    shards = data_path if spec.data.shards is not None else None  # resolved: the tasks run elsewhere
    base_cfg = trial_config(
        spec,
        {"batch_size_sequences": b0, "seed": spec.seeds[0], **hp},
        "branch-base",
        data_path=data_path,
        shards=shards,
    )
    positive = [p for p in points if p > 0]
    with ray_session(ray_address, spec):
        task = ray.remote(num_cpus=spec.resources.cpus_per_worker)(train_in_process)
        if positive:
            # the last point's state is needed too: the loop does not save a state with its final report
            end = max(positive) + step_tokens
            base_run = replace(
                base_cfg,
                budget_tokens=end,
                eval=replace(base_cfg.eval, milestones_tokens=tuple(positive) + (end,), checkpoint_every_milestones=1),
            )
            save = {p: str(states_dir / f"base_{p}.pt") for p in positive}
            base = cast(dict[str, Any], ray.get(task.remote(base_run.to_dict(), None, save)))
        else:
            base = {"status": TrialOutcome.COMPLETED, "reports": [], "flops_per_token": None, "wall_s": 0.0}
        refs = {}
        for p in points:
            for k in br.multipliers:
                b = int(round(k * b0))
                bhp = hyperparameters_for(spec, b, {})
                bhp.update(
                    lr=hp["lr"] * math.sqrt(k), lr_rule="sqrt", beta2_half_life_tokens=hp["beta2_half_life_tokens"]
                )
                bhp["beta2"] = beta2_from_half_life(hp["beta2_half_life_tokens"], b, T)
                cfg = trial_config(
                    spec,
                    {"batch_size_sequences": b, "seed": spec.seeds[0], **bhp},
                    f"branch-{p}-k{k}",
                    data_path=data_path,
                    shards=shards,
                )
                end = p + br.window_tokens
                cfg = replace(
                    cfg,
                    budget_tokens=end,
                    eval=replace(
                        cfg.eval, milestones_tokens=(end,), checkpoint_every_milestones=0, raw_every_milestone=True
                    ),
                )
                if p > 0:
                    # a branch continues the base run's LR warmup (in tokens, set by B0); it does not
                    # ramp again over warmup_min_steps steps of its own larger batch
                    cfg = replace(
                        cfg, schedule=replace(cfg.schedule, warmup_tokens=base_warmup_tokens, warmup_min_steps=0)
                    )
                state = str(states_dir / f"base_{p}.pt") if p > 0 else None
                refs[(p, k)] = task.remote(cfg.to_dict(), state, None)
        return base, {key: ray.get(ref) for key, ref in refs.items()}


def _local_cbs_at(p: int, br: BranchSpec, b0: int, results: dict[tuple[int, float], dict[str, Any]]) -> dict[str, Any]:
    """The local CBS at point ``p`` from its branches' raw-weights validation losses at the window's end."""
    losses = {}
    for k in br.multipliers:
        r = results[(p, k)]
        last = r["reports"][-1] if r["reports"] else {}
        raw = last.get("val_loss_raw")
        losses[k] = raw if (r["status"] == TrialOutcome.COMPLETED and raw is not None) else float("nan")
    k_star = local_cbs_multiplier(losses, br.epsilon)
    ended = {
        str(k): (results[(p, k)]["reports"][-1]["tokens_seen"] if results[(p, k)]["reports"] else None)
        for k in br.multipliers
    }
    return {
        "tokens_seen": p,
        "k_star": k_star,
        "local_cbs_sequences": None if k_star is None else k_star * b0,
        "losses": {str(k): (v if math.isfinite(v) else None) for k, v in losses.items()},
        "tokens_seen_at_loss": ended,
    }


def _log_branches(
    client,
    spec: SweepSpec,
    br: BranchSpec,
    b0: int,
    results: dict[tuple[int, float], dict[str, Any]],
    from_run_id: str | None,
    flops_measurement: float,
) -> str:
    """Log each branch as an MLflow child run of ``from_run_id`` (or of a new branch parent); the parent's id."""
    from mlflow.entities import Metric, Param

    from sweeps.tracking.writer import create_experiment

    exp = client.get_experiment_by_name(spec.experiment_name)
    exp_id = exp.experiment_id if exp else create_experiment(client, spec.experiment_name)
    parent = from_run_id
    if parent is None:
        parent = client.create_run(
            exp_id,
            run_name=f"{spec.name}-branching",
            tags={TAG_ROLE: ROLE_BRANCH_SWEEP, TAG_STATUS: SweepStatus.RUNNING},
        ).info.run_id
    ts = int(time.time() * 1000)
    for (p, k), r in results.items():
        run = client.create_run(
            exp_id,
            run_name=f"branch-t{p}-k{k}",
            tags={TAG_PARENT_RUN_ID: parent, TAG_ROLE: ROLE_BRANCH, TAG_STATUS: r["status"].upper()},
        )
        rid = run.info.run_id
        client.log_batch(
            rid,
            params=[
                Param("branch_tokens_seen", str(p)),
                Param("multiplier", str(k)),
                Param(PARAM_BATCH_SIZE_SEQUENCES, str(int(round(k * b0)))),
                Param("window_tokens", str(br.window_tokens)),
            ],
        )
        ms = []
        for m in r["reports"]:
            for key in ("val_loss", "val_loss_raw", "train_loss"):
                v = m.get(key)
                if isinstance(v, float) and math.isfinite(v):
                    ms.append(Metric(key, v, ts, int(m["tokens_seen"])))
        if r["reports"]:
            ms.append(
                Metric("flops_measurement", float((r["reports"][-1]["tokens_seen"] - p) * r["flops_per_token"]), ts, 0)
            )
        if ms:
            client.log_batch(rid, metrics=ms)
        completed = r["status"] == TrialOutcome.COMPLETED
        client.set_terminated(rid, status=MLFLOW_RUN_FINISHED if completed else MLFLOW_RUN_FAILED)
    client.log_batch(parent, metrics=[Metric("flops_measurement_branching", float(flops_measurement), ts, 0)])
    if from_run_id is None:
        client.set_tag(parent, TAG_STATUS, SweepStatus.SUCCEEDED)
        client.set_terminated(parent, MLFLOW_RUN_FINISHED)
    return parent
