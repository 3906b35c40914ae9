"""Inputs that used to end in a traceback, a false "ok" or a half-started sweep: each exits 2 with one
line naming the field or flag, before Ray starts, and leaves nothing behind.

``--address 127.0.0.1:9`` (nothing listens there) makes any attempt to reach Ray fail with another
error, so an exit 2 with the expected message proves the refusal came first. The CLI runs in this
process (typer's CliRunner, ``tests.conftest.invoke_cli``): no subprocess is needed to see an exit code.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from typer.testing import CliRunner

from critbatch.main import app
from tests.conftest import ROOT, invoke_cli, write_spec

NO_RAY = ["--address", "127.0.0.1:9"]


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _assert_refused(r, *needles: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    lines = _error_lines(r.stderr)
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def _run(tmp_path: Path, d: dict, *extra: str, out: Path | None = None, env: dict | None = None):
    out = out or tmp_path / "out"
    args = ["run", str(write_spec(tmp_path, d)), "--output", str(out), "--no-progress", *NO_RAY]
    if "--tracking-uri" not in extra:
        args += ["--tracking-uri", f"sqlite:///{tmp_path / 'ml.db'}"]
    return invoke_cli(args + list(extra), env=env)


def test_a_data_path_uri_is_refused_by_validate_and_run(tmp_path, tiny_spec_dict):
    d = copy.deepcopy(tiny_spec_dict)
    d["data"]["path"] = "file://" + str(ROOT / "data" / "tinyshakespeare" / "input.txt")
    v = CliRunner().invoke(app, ["validate", str(write_spec(tmp_path, d))])
    assert v.exit_code == 2 and "data.path" in v.output and "URI" in v.output, v.output
    r = _run(tmp_path, d)
    assert r.returncode == 2 and "data.path" in r.stderr and "URI" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "ml.db").exists()


def test_an_empty_tokenizer_folder_is_refused_without_a_traceback(tmp_path, tiny_spec_dict):
    empty = tmp_path / "tok"
    empty.mkdir()
    d = copy.deepcopy(tiny_spec_dict)
    d["data"]["tokenizer"] = str(empty)
    v = CliRunner().invoke(app, ["validate", str(write_spec(tmp_path, d))])
    assert v.exit_code == 2, v.output
    assert v.exception is None or isinstance(v.exception, SystemExit), repr(v.exception)
    assert "data.tokenizer" in v.output and "holds no Hugging Face tokenizer" in v.output, v.output
    _assert_refused(_run(tmp_path, d), "data.tokenizer", str(empty))
    assert not (tmp_path / "out").exists()


def test_an_output_folder_that_cannot_be_created_is_refused_before_ray(tmp_path, tiny_spec_dict):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = blocker / "sub" / "out"
    _assert_refused(_run(tmp_path, tiny_spec_dict, out=out), "--output", "cannot create the folder")
    assert blocker.read_text() == "not a folder" and not (tmp_path / "ml.db").exists()


def test_an_output_folder_under_a_missing_tree_leaves_no_folder_behind(tmp_path, tiny_spec_dict):
    # the folder itself can be made, but the sweep is refused later (file store): every folder made goes
    out = tmp_path / "x" / "y" / "out"
    r = _run(tmp_path, tiny_spec_dict, "--tracking-uri", f"file://{tmp_path / 'mlruns'}", out=out)
    _assert_refused(r, "--tracking-uri", "MLFLOW_ALLOW_FILE_STORE")
    assert not (tmp_path / "x").exists() and not (tmp_path / "mlruns").exists()


@pytest.mark.parametrize(
    "uri_of", [lambda t: f"file://{t / 'mlruns'}", lambda t: str(t / "mlruns")], ids=["file-uri", "bare-folder"]
)
def test_a_file_store_without_mlflows_opt_in_is_refused(tmp_path, tiny_spec_dict, uri_of):
    r = _run(tmp_path, tiny_spec_dict, "--tracking-uri", uri_of(tmp_path), env={"MLFLOW_ALLOW_FILE_STORE": None})
    _assert_refused(r, "--tracking-uri", "MLFLOW_ALLOW_FILE_STORE=true")
    assert not (tmp_path / "out").exists() and not (tmp_path / "mlruns").exists()


def test_the_file_store_refusal_names_the_spec_field_when_the_spec_gave_it(tmp_path, tiny_spec_dict):
    d = copy.deepcopy(tiny_spec_dict)
    d["tracking"] = {"uri": f"file://{tmp_path / 'mlruns'}"}
    r = invoke_cli(["run", str(write_spec(tmp_path, d)), "--output", str(tmp_path / "out"), "--no-progress", *NO_RAY])
    _assert_refused(r, "tracking.uri")
    assert not (tmp_path / "out").exists()


def test_a_sqlite_tracking_uri_in_a_missing_folder_is_refused(tmp_path, tiny_spec_dict):
    r = _run(tmp_path, tiny_spec_dict, "--tracking-uri", f"sqlite:///{tmp_path / 'nope' / 'ml.db'}")
    _assert_refused(r, "--tracking-uri", "does not exist")
    assert not (tmp_path / "out").exists() and not (tmp_path / "nope").exists()
