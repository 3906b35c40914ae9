"""Sweeps that more than one test reads: each runs once per session, on the suite's Ray head."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest


def precision_spec_dict() -> dict:
    """The tiny ``search.precision`` sweep: ``search.strategy: transfer`` over batch sizes 8 and 16, two trials
    each, until ``b_crit``'s interval is no wider than 1.5x or 6 trials have run. Two batch sizes give no fit,
    so the first wave's analysis adds a second wave (batch size 32, two trials) and the sweep stops there."""
    from tests.conftest import tiny_spec

    d = tiny_spec()
    d["name"] = "transfer"
    d["search"].update(
        strategy="transfer",
        batch_sizes_sequences=[8, 16],
        trials_per_batch_size=2,
        precision={"b_crit_ratio": 1.5, "max_trials": 6},
    )
    return d


@dataclass(frozen=True)
class FinishedSweep:
    """A ``critbatch run`` that exited 0: its output folder, MLflow store and what it printed."""

    out: Path
    tracking_uri: str
    stdout: str

    def read(self, name: str):
        """``OUT/<name>`` as JSON."""
        return json.loads((self.out / name).read_text())


@pytest.fixture(scope="session")
def precision_sweep(tmp_path_factory, ray_head, mlflow_template) -> FinishedSweep:
    """:func:`precision_spec_dict` run uninterrupted (~40 s idle): what ``test_transfer.py`` checks, and the
    answer ``test_precision_resume.py``'s interrupted and resumed run must end with. Read it, never write to it."""
    from tests.conftest import run_cli, write_spec
    from tests.harness import copy_mlflow_store

    tmp = tmp_path_factory.mktemp("precision-sweep")
    uri = copy_mlflow_store(mlflow_template, tmp / "mlflow.db")
    out = tmp / "out"
    r = run_cli(
        [
            "run",
            str(write_spec(tmp, precision_spec_dict())),
            "--output",
            str(out),
            "--tracking-uri",
            uri,
            "--no-progress",
            "--address",
            ray_head.gcs_address,
        ],
        timeout_s=400,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return FinishedSweep(out=out, tracking_uri=uri, stdout=r.stdout)
