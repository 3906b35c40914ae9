"""The in-process Ray start's retry (``sweeps.launch.cluster.init_ray``): which failures are retried, and
the one-line error when every attempt fails. ``ray.init`` is replaced here by a function that fails as
Ray was seen to fail on a loaded machine; what a real start does is covered by every sweep test."""

from __future__ import annotations

import pytest

from sweeps.errors import CritbatchError
from sweeps.launch import cluster
from sweeps.spec import parse_spec
from tests.conftest import ROOT, TINY


@pytest.fixture
def spec(tiny_spec_dict):
    return parse_spec(tiny_spec_dict)


def _failing_init(monkeypatch, failures: list[BaseException]):
    import ray

    calls = []

    def fake_init(*a, **kw):
        calls.append(kw.get("address"))
        if failures:
            raise failures.pop(0)

    monkeypatch.setattr(ray, "init", fake_init)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return calls


def test_an_eoferror_at_start_is_retried_then_the_start_succeeds(monkeypatch, spec):
    calls = _failing_init(monkeypatch, [EOFError(), Exception("Ray timed out during startup")])
    assert cluster.init_ray(None, spec) is True
    assert calls == ["local", "local", "local"]


def test_every_attempt_failing_ends_in_one_line_that_says_what_to_do(monkeypatch, spec):
    calls = _failing_init(monkeypatch, [EOFError()] * cluster.LOCAL_START_ATTEMPTS)
    with pytest.raises(
        CritbatchError, match=r"Ray did not start in this process \(3 attempts; the last: EOFError"
    ) as e:
        cluster.init_ray(None, spec)
    assert "--address" in str(e.value) and "\n" not in str(e.value)
    assert len(calls) == cluster.LOCAL_START_ATTEMPTS


def test_other_errors_are_not_retried(monkeypatch, spec):
    calls = _failing_init(monkeypatch, [ValueError("bad resources")])
    with pytest.raises(ValueError, match="bad resources"):
        cluster.init_ray(None, spec)
    assert calls == ["local"]


def test_a_local_start_keeps_token_authentication_without_rays_warning(tmp_path):
    """A real in-process start with RAY_AUTH_MODE unset (as a user's shell has it): the cluster uses
    token authentication, Ray's default (Ray sets the mode to token and writes ~/.ray/auth_token), and
    prints no warning about it (a newcomer read "Token authentication is enabled ..." as something gone
    wrong)."""
    import os
    import subprocess
    import sys

    code = (
        "import os, ray, yaml; from sweeps.launch import cluster; from sweeps.spec import parse_spec; "
        f"d = yaml.safe_load(open({str(TINY)!r})); d['data']['path'] = 'x.txt'; "
        "assert cluster.init_ray(None, parse_spec(d)); print('mode', os.environ.get('RAY_AUTH_MODE')); ray.shutdown()"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    env["HOME"] = str(tmp_path)
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180, cwd=str(ROOT)
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "mode token" in r.stdout
    assert (tmp_path / ".ray" / "auth_token").is_file()
    assert "Token authentication is enabled" not in r.stderr, r.stderr[-2000:]
