"""``critbatch ui``'s refusals (exit 2, one clear line) before any MLflow server starts. The server itself:
``tests/sweeps/tracking/test_ui.py``."""

from __future__ import annotations

import socket

import pytest

from tests.conftest import invoke_cli


def _file_store(tmp_path):
    """The smallest store ``check_existing_store`` accepts: a file store holding experiment 0."""
    (tmp_path / "store" / "0").mkdir(parents=True)
    (tmp_path / "store" / "0" / "meta.yaml").write_text("experiment_id: '0'\nname: Default\n")
    return str(tmp_path / "store")


@pytest.mark.parametrize("port", ["0", "70000", "-1"])
def test_a_port_out_of_range_exits_2(port):
    r = invoke_cli(["ui", "--port", port])
    assert r.returncode == 2
    assert f"error: port must be an integer from 1 to 65535, got {port}" in r.stderr


def test_a_missing_store_exits_2_and_says_what_writes_one(tmp_path):
    r = invoke_cli(["ui", "--backend-store-uri", f"sqlite:///{tmp_path / 'none.db'}", "--port", "5000"])
    assert r.returncode == 2
    assert "none.db" in r.stderr and "`make run` writes sqlite:///mlflow.db" in r.stderr
    assert not (tmp_path / "none.db").exists()  # nothing created


def test_a_server_uri_and_a_bad_timeout_exit_2(tmp_path):
    r = invoke_cli(["ui", "--backend-store-uri", "http://127.0.0.1:5000"])
    assert r.returncode == 2 and "is a tracking server" in r.stderr
    r = invoke_cli(["ui", "--backend-store-uri", _file_store(tmp_path), "--start-timeout-s", "0"])
    assert r.returncode == 2 and "--start-timeout-s must be positive" in r.stderr


def test_a_port_in_use_exits_2(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = invoke_cli(["ui", "--backend-store-uri", _file_store(tmp_path), "--port", str(port)])
    assert r.returncode == 2
    assert f"port {port} on 127.0.0.1 is in use" in r.stderr
