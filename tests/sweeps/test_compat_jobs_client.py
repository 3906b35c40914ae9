"""``sweeps/_compat.py::job_submission_client``: Ray's job client for exactly one address, with a timeout on
every request; the private ``JobSubmissionClient._do_request`` it overrides, against the installed Ray."""

from __future__ import annotations

import inspect
import os

import pytest

from sweeps._compat import is_job_not_found, job_submission_client


def test_explicit_address_wins_over_ray_address_env(monkeypatch):
    """Ray lets RAY_ADDRESS override the address argument; an explicit --address must win."""
    seen = {}

    class Client:
        def __init__(self, address, headers=None):
            seen["address"], seen["env"] = address, os.environ.get("RAY_ADDRESS")

    import ray.job_submission

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", Client)
    monkeypatch.setenv("RAY_ADDRESS", "http://other:8265")
    job_submission_client("http://mine:8265", None)
    assert seen == {"address": "http://mine:8265", "env": None}
    assert os.environ["RAY_ADDRESS"] == "http://other:8265"


def test_a_timeout_reaches_every_request_through_the_private_do_request(monkeypatch):
    """``_do_request(method, endpoint, **kwargs)`` hands its kwargs to ``requests.request``: the
    override adds ``timeout``, the constructor's version check included."""
    import requests
    from ray.job_submission import JobSubmissionClient

    params = inspect.signature(JobSubmissionClient._do_request).parameters
    assert list(params)[:3] == ["self", "method", "endpoint"] and "kwargs" in params
    seen = []

    def request(method, url, **kwargs):
        seen.append((method, url, kwargs.get("timeout")))
        raise requests.exceptions.ConnectionError("refused")

    monkeypatch.setattr(requests, "request", request)
    with pytest.raises(Exception):
        job_submission_client("http://127.0.0.1:9", None, timeout_s=1.5)
    assert seen and all(t == 1.5 for _, _, t in seen)


def test_not_found_is_recognised_in_rays_error_text():
    assert is_job_not_found(RuntimeError("Request failed with status code 404: Job x does not exist."))
    assert not is_job_not_found(RuntimeError("Request failed with status code 500"))
