"""The service installs without torch: a fresh virtual environment with ``.[service]`` (the torch-free core
plus the service's extra, pinned by constraints.txt) builds the FastAPI app and its OpenAPI document."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import venv

import pytest

from tests.conftest import ROOT

CHECK = (
    "import importlib.util, json\n"
    "assert importlib.util.find_spec('torch') is None, 'torch is installed'\n"
    "from service.app import create_app\n"
    "from service.settings import Settings\n"
    "doc = create_app(Settings(api_token='x' * 16, ray_address='http://127.0.0.1:9')).openapi()\n"
    "import ray.job_submission, mlflow, sqlalchemy, requests, uvicorn  # what sweeps.remote imports on first use\n"
    "print(json.dumps(sorted(doc['paths'])))\n"
)


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_the_service_extra_installs_and_serves_without_torch(tmp_path):
    """pip installs ``critbatch[service]`` from a copy of this checkout into a new venv (PyPI through pip's
    cache); there, torch is absent, ``create_app`` builds the app and its OpenAPI document, and the Ray Jobs
    and MLflow clients the routes use on first call import."""
    src = tmp_path / "src"  # a copy: building a wheel writes build/ and *.egg-info beside the sources
    for name in ("critbatch", "sweeps", "workloads", "service"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_NO_CACHE_DIR")}
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints.txt"), f"{src}[service]"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    # from tmp_path, not the checkout: the installed packages are the ones imported (the first import of a
    # fresh venv compiles every module: minutes on a loaded 2-core machine)
    r = subprocess.run([python, "-c", CHECK], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    paths = json.loads(r.stdout.strip().splitlines()[-1])
    assert {"/healthz", "/v1/sweeps", "/v1/sweeps/{sweep_id}/report"} <= set(paths), paths
