"""A scaling study run: one workload swept at several token budgets, each member an ordinary sweep folder
(``STUDY/members/tokens-<D>``, resumable on its own), the smallest budget first, each member starting its learning
rate search where the previous member found the best learning rate at the base batch size (the optimum moves with
the budget: the study records where each member started and what it found, it does not assume a rule).

``STUDY/study.json`` binds the folder to its spec's fingerprint and budgets; running the same command again (or
``critbatch scale --resume``) continues: finished members are kept, a started one is resumed, the rest are run.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from sweeps.errors import InvalidInput
from sweeps.files import write_json
from sweeps.spec import SweepSpec
from sweeps.spec.statuses import FINISHED_STATUSES, SweepStatus
from sweeps.spec.tracking import STUDY_TAG_KEYS

__all__ = ["STUDY_FILE", "STUDY_TAG", "member_spec", "run_study"]

#: the study's record in its folder
STUDY_FILE = "study.json"
#: the MLflow tag every member's runs carry: the study's name (and ``critbatch.budget_tokens``, the member's budget)
STUDY_TAG = STUDY_TAG_KEYS[0]


def member_spec(spec: SweepSpec, budget_tokens: int, base_lr: float | None) -> SweepSpec:
    """The member sweep of ``spec`` at ``budget_tokens`` (tokens per trial), named ``NAME.D<tokens>``, in the
    study's MLflow experiment, tagged :data:`STUDY_TAG`; its ``search.base_lr`` is ``base_lr`` when given.

    Raises:
        InvalidInput: the member spec is invalid (its milestones at that budget, say: ``check_milestones``).
    """
    from pydantic import ValidationError

    from sweeps.spec.milestones import check_milestones

    data = spec.model_dump(mode="json")
    data["name"] = f"{spec.name}.D{budget_tokens}"
    data["budget_tokens"] = int(budget_tokens)
    if base_lr is not None:
        data["search"]["base_lr"] = float(base_lr)
    tracking = dict(data.get("tracking") or {})
    tracking["experiment"] = spec.experiment_name
    tracking["tags"] = {**(tracking.get("tags") or {}), STUDY_TAG: spec.name, STUDY_TAG_KEYS[1]: str(budget_tokens)}
    data["tracking"] = tracking
    try:
        member = SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput(f"the member at {budget_tokens} tokens is not a valid sweep: {exc}") from None
    check_milestones(member)
    return member


def _best_lr_at_base(cbs: dict[str, Any], base_batch: int) -> float | None:
    """The best learning rate a finished member found at the base batch size (``cbs.json`` ``lr_per_batch``)."""
    for row in cbs.get("lr_per_batch") or []:
        if row.get("batch_size_sequences") == base_batch and row.get("best_lr"):
            return float(row["best_lr"])
    return None


def _claim(output: Path, spec: SweepSpec, budgets: list[int], predict_tokens: float | None) -> dict[str, Any]:
    """The study's record: a new one (the folder must be empty or absent), or the one already there when it ran
    this spec at these budgets. Raises InvalidInput otherwise."""
    path = output / STUDY_FILE
    if path.is_file():
        study = json.loads(path.read_text(encoding="utf-8"))
        if study.get("fingerprint") != spec.fingerprint() or study.get("budgets_tokens") != budgets:
            raise InvalidInput(
                f"{output} holds a study of another spec or other budgets (fingerprint "
                f"{study.get('fingerprint')}, budgets {study.get('budgets_tokens')}): choose another "
                "--output, or give the same spec and --budgets-tokens to continue it"
            )
        if predict_tokens is not None:
            study["predict_tokens"] = predict_tokens
        return study
    if output.exists() and any(output.iterdir()):
        raise InvalidInput(f"--output {output} is not empty and holds no study: choose a new folder")
    return {
        "name": spec.name,
        "fingerprint": spec.fingerprint(),
        "budgets_tokens": budgets,
        "predict_tokens": predict_tokens,
        "status": SweepStatus.RUNNING,
        "members": [],
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def run_study(
    spec: SweepSpec,
    budgets_tokens: list[int],
    output: Path,
    *,
    predict_tokens: float | None = None,
    tracking_uri: str | None = None,
    ray_address: str | None = None,
    show_progress: bool = True,
    run_member=None,
    resume_member=None,
) -> dict[str, Any]:
    """Run (or continue) the study of ``spec`` at ``budgets_tokens`` into ``output``.

    Args:
        spec: one sweep's spec (no ``arms``); its ``budget_tokens`` is replaced by each budget.
        budgets_tokens: two or more distinct token budgets per trial; run smallest first.
        output: the study folder (new, or one this study started).
        predict_tokens: the production budget to predict at (tokens), if any.
        tracking_uri, ray_address, show_progress: as for :func:`sweeps.run.api.run_sweep`.
        run_member, resume_member: the functions that run and resume one member (default
            :func:`sweeps.run.api.run_sweep` and :func:`~sweeps.run.api.resume_sweep`).

    Returns:
        ``study.json``'s content: ``status`` ``SUCCEEDED`` (every member answered), ``STOPPED`` (a member was
        stopped by a signal: ``exit_code`` 130/143; run the command again to continue) or ``FAILED``.

    Raises:
        InvalidInput: a spec with arms, fewer than two budgets, a member spec that is invalid at its budget
            (every member is checked before anything starts), a folder holding another study.
    """
    from sweeps.run.api import resume_sweep, run_sweep

    run_member, resume_member = run_member or run_sweep, resume_member or resume_sweep
    if spec.arms:
        raise InvalidInput("a scaling study sweeps one spec at several budgets: give a spec without arms")
    budgets = sorted({int(b) for b in budgets_tokens})
    if len(budgets) < 2 or budgets[0] <= 0:
        raise InvalidInput(f"--budgets-tokens needs two or more distinct positive budgets, got {budgets_tokens}")
    for b in budgets:  # every member valid before the first starts
        member_spec(spec, b, None)
    output = Path(output).expanduser().resolve()
    study = _claim(output, spec, budgets, predict_tokens)
    output.mkdir(parents=True, exist_ok=True)
    write_json(output / STUDY_FILE, study)
    base_lr = None
    members = []
    for b in budgets:
        folder = output / "members" / f"tokens-{b}"
        record = {"budget_tokens": b, "folder": str(folder.relative_to(output))}
        state = _sweep_status(folder)
        if state in FINISHED_STATUSES:  # a failed member is kept as it is: `critbatch resume` it to retry
            result_ok, cbs = state == SweepStatus.SUCCEEDED, _read_cbs(folder)
        else:
            if state is None:
                record["start_lr"] = base_lr if base_lr is not None else spec.search.base_lr
                result = run_member(
                    member_spec(spec, b, base_lr),
                    folder,
                    tracking_uri=tracking_uri,
                    ray_address=ray_address,
                    show_progress=show_progress,
                )
            else:
                result = resume_member(folder, ray_address=ray_address, show_progress=show_progress)
            if result.exit_code:
                study.update(status=SweepStatus.STOPPED, exit_code=result.exit_code, members=members + [record])
                write_json(output / STUDY_FILE, study)
                return study
            result_ok, cbs = result.ok, _read_cbs(folder)
        record.update(
            status=SweepStatus.SUCCEEDED if result_ok else SweepStatus.FAILED,
            b_crit=cbs.get("b_crit"),
            b_crit_ci=cbs.get("b_crit_ci"),
            b_crit_status=cbs.get("status"),
            target_loss=cbs.get("target_loss"),
            best_lr_at_base=_best_lr_at_base(cbs, spec.search.base_batch_size_sequences),
        )
        record.setdefault("start_lr", _start_lr(folder))
        members.append(record)
        base_lr = record["best_lr_at_base"] or base_lr
        study.update(members=members)
        write_json(output / STUDY_FILE, study)
    succeeded = all(m["status"] == SweepStatus.SUCCEEDED for m in members)
    study["status"] = SweepStatus.SUCCEEDED if succeeded else SweepStatus.FAILED
    study.pop("exit_code", None)
    write_json(output / STUDY_FILE, study)
    return study


def _sweep_status(folder: Path) -> str | None:
    """A member folder's ``sweep.json`` status, None when the member never started."""
    try:
        return json.loads((folder / "sweep.json").read_text(encoding="utf-8")).get("status")
    except (OSError, ValueError):
        return None


def _read_cbs(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / "cbs.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _start_lr(folder: Path) -> float | None:
    """The ``search.base_lr`` a member ran with (its resolved ``spec.yaml``)."""
    import yaml

    try:
        return float(yaml.safe_load((folder / "spec.yaml").read_text(encoding="utf-8"))["search"]["base_lr"])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return None
