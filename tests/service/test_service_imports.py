"""The service's dependency boundary: no torch, transformers, Ray Tune/Train, and of ``workloads`` only
its torch-free interface (``workloads.api`` at import: the error base, the config types), none of the
modules it loads on first use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("torch", "transformers", "ray.tune", "ray.train", "optuna", "peft")


def test_service_imports_no_training_stack():
    code = (
        "import sys, service.app, service.server, service.settings, sweeps.remote, critbatch.cluster\n"
        "from service.app import create_app\n"
        "from service.settings import Settings\n"
        "create_app(Settings(api_token='x' * 16, ray_address='http://127.0.0.1:9')).openapi()\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r} or m.startswith(('ray.tune', 'ray.train')))\n"
        "import workloads.api\n"
        "bad += sorted(m for m in sys.modules if m in set(workloads.api._LAZY.values()) or m.startswith('workloads.ray.'))\n"
        "print(bad)\n"
        "assert not bad, bad\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
