"""A sweep's and a trial's statuses are written once, in ``sweeps/spec/statuses.py``: product code names them
through ``SweepStatus``, ``TrialStatus`` or the tuples beside them, never as string literals. A status spelled
out again (``status == "FAILED"``, ``{"status": "RUNNING"}``, ``set_status("PAUSED")``) fails here, naming
its file and line.

Other systems' statuses that share a spelling are named after their owner: Ray Tune's
(``ray.tune.experiment.trial.Trial.RUNNING``), Ray Jobs' (``ray.job_submission.JobStatus``), Optuna's
(``TrialState.PRUNED.name``) and MLflow's (``sweeps.tracking.schema.MLFLOW_RUN_*``, checked against MLflow below).
"""

from __future__ import annotations

import ast
from pathlib import Path

from sweeps.spec.statuses import SweepStatus, TrialStatus

ROOT = Path(__file__).resolve().parents[1]
#: the product's packages (tests, benchmarks and docs may spell statuses out)
PACKAGES = ("critbatch", "sweeps", "service", "workloads")
#: where the statuses are defined
OWNER = "sweeps/spec/statuses.py"
STATUS_VALUES = frozenset(s.value for s in SweepStatus) | frozenset(s.value for s in TrialStatus)
#: module-level names allowed to hold a status's spelling, with the reason
ALLOWED_NAMES = {
    # MLflow's RunStatus names, held as strings so that readers need no MLflow import
    ("sweeps/tracking/schema.py", "MLFLOW_RUN_RUNNING"): "MLflow's run status",
    ("sweeps/tracking/schema.py", "MLFLOW_RUN_FAILED"): "MLflow's run status",
}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the constant nodes that are docstrings (or other bare string statements)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def _allowed(tree: ast.Module, rel: str) -> set[int]:
    """The ids of the constants assigned at module level to a name of :data:`ALLOWED_NAMES`."""
    out = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            if any(isinstance(t, ast.Name) and (rel, t.id) in ALLOWED_NAMES for t in node.targets):
                out.add(id(node.value))
    return out


def status_literals(source: str, rel: str) -> list[str]:
    """``"FILE:LINE: 'VALUE'"`` for each string constant in ``source`` that spells a sweep or trial status,
    outside docstrings and the names :data:`ALLOWED_NAMES` lets hold one."""
    tree = ast.parse(source)
    skip = _docstrings(tree) | _allowed(tree, rel)
    return [
        f"{rel}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in STATUS_VALUES
        and id(node) not in skip
    ]


def test_the_scan_finds_a_status_compared_assigned_or_passed_and_leaves_docstrings_and_other_words():
    source = '''
"""A module that says FAILED in its docstring."""
def f(state, trial, client):
    """RUNNING"""
    if state.status == "FAILED":
        state.status = "STOPPED"
    trial.set_status("PAUSED")
    record = {"status": "COMPLETED", "kind": "comparison"}
    return "running", f"{state.status} FAILED", record
'''
    found = status_literals(source, "x.py")
    assert found == ["x.py:5: 'FAILED'", "x.py:6: 'STOPPED'", "x.py:7: 'PAUSED'", "x.py:8: 'COMPLETED'"]


def test_the_allowed_names_hold_what_they_say():
    from mlflow.entities import RunStatus

    from sweeps.tracking import schema

    assert schema.MLFLOW_RUN_RUNNING == RunStatus.to_string(RunStatus.RUNNING)
    assert schema.MLFLOW_RUN_FINISHED == RunStatus.to_string(RunStatus.FINISHED)
    assert schema.MLFLOW_RUN_FAILED == RunStatus.to_string(RunStatus.FAILED)
    assert schema.MLFLOW_RUN_KILLED == RunStatus.to_string(RunStatus.KILLED)
    assert all(getattr(schema, name) in STATUS_VALUES for _, name in ALLOWED_NAMES)  # no stale entry


def test_product_code_names_every_sweep_and_trial_status_through_the_enums():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel != OWNER:
                found += status_literals(path.read_text(encoding="utf-8"), rel)
    assert not found, "status literals outside sweeps/spec/statuses.py (use SweepStatus/TrialStatus):\n" + "\n".join(
        found
    )
