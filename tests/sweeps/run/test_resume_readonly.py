"""``critbatch resume OUT`` on an output folder it cannot write: one line naming the folder and exit 2, before
Ray starts (it ended in a 53-line traceback from the lock file, ``PermissionError``, once Ray was up).

Root ignores ``chmod``: run as root, the CLI runs without ``CAP_DAC_OVERRIDE`` (``setpriv``), so the
read-only folder binds it as it binds any user; the test is skipped only where that cannot be arranged.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sweeps.spec import parse_spec
from tests.conftest import ROOT

_DROP = "-dac_override,-dac_read_search"


def _unprivileged(probe_dir: Path) -> list[str]:
    """The command prefix under which ``chmod a-w`` binds this process's children (empty unless root); skips the
    test when root cannot shed the capability that ignores it."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root, where chmod does not stop writes, and setpriv is not installed")
    prefix = [setpriv, f"--bounding-set={_DROP}", f"--inh-caps={_DROP}"]
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", f"open({str(probe_dir / 'probe')!r}, 'w')"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode == 0 or "PermissionError" not in probe.stderr:
        pytest.skip(f"running as root, and setpriv could not drop CAP_DAC_OVERRIDE: {probe.stderr[-300:]}")
    return prefix


def _read_only(folder: Path) -> None:
    for p in [folder, *folder.rglob("*")]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _writable(folder: Path) -> None:
    for p in [folder, *folder.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)


def _minimal_sweep(out: Path, spec: dict) -> None:
    """An interrupted sweep's folder as far as resume reads it before Ray: ``sweep.json`` and ``spec.yaml``."""
    out.mkdir()
    (out / "spec.yaml").write_text(yaml.safe_dump(spec))
    (out / "sweep.json").write_text(
        json.dumps(
            {
                "sweep_id": "tiny-ro",
                "fingerprint": parse_spec(spec).fingerprint(),
                "tracking_uri": f"sqlite:///{out}/mlflow.db",
                "experiment_id": "1",
                "parent_run_id": "0" * 32,
                "data_path": spec["data"]["path"],
                "ray_address": None,
                "storage_root": str(out),
                "optuna_storage": f"sqlite:///{out}/optuna.db",
                "status": "RUNNING",
            }
        )
    )


def _minimal_comparison(out: Path, spec: dict) -> None:
    out.mkdir()
    spec = {**spec, "arms": [{"name": "a"}, {"name": "b", "search": {"lr_rules": ["linear"]}}]}
    (out / "spec.yaml").write_text(yaml.safe_dump(spec))
    (out / "comparison.json").write_text(
        json.dumps(
            {
                "comparison_id": "tiny-ro",
                "fingerprint": parse_spec(spec).fingerprint(),
                "status": "RUNNING",
                "tracking_uri": None,
                "ray_address": None,
                "arms": [{"name": n, "sweep_id": f"tiny-ro.{n}", "output": str(out / "arms" / n)} for n in ("a", "b")],
            }
        )
    )


@pytest.mark.parametrize("make", [_minimal_sweep, _minimal_comparison], ids=["sweep", "comparison"])
def test_resume_of_a_read_only_folder_is_one_line_naming_it_and_exit_2(tmp_path, tiny_spec_dict, make):
    out = tmp_path / "OUT"
    make(out, tiny_spec_dict)
    _read_only(out)
    try:
        prefix = _unprivileged(out)
        env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", RAY_ADDRESS="127.0.0.1:9")
        r = subprocess.run(
            [*prefix, sys.executable, "-m", "critbatch", "resume", str(out), "--no-progress"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        _writable(out)  # so that pytest can remove it
    said = (r.stdout + r.stderr).strip()
    assert r.returncode == 2, said
    assert said.count("\n") == 0 and "Traceback" not in said, said
    assert said.startswith("error: cannot resume: output folder ") and f"{out} is not writable" in said, said
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["spec.yaml", "sweep.json" if make is _minimal_sweep else "comparison.json"]
    )  # nothing written
