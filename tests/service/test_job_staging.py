"""Staging a sweep for Ray Jobs: the entrypoint, the working directory, shipped data, size limits."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from svc_fakes import tiny_spec

from sweeps.errors import InvalidInput
from sweeps.remote import (
    StagingError,
    StagingLimits,
    build_entrypoint,
    default_job_python,
    stage_sweep,
    staged_sweep,
)
from sweeps.spec import parse_spec
from sweeps.spec.identity import check_sweep_id, default_sweep_id, redact_uri

REPO = Path(__file__).resolve().parents[2]


def tiny(**over):
    """The tiny spec with a SQLite tracking URI, parsed; each keyword replaces a whole section."""
    return parse_spec({**tiny_spec(), "tracking": {"uri": "sqlite:///mlflow.db"}, **over})


def test_entrypoint_is_a_quoted_command_that_never_carries_the_spec():
    uri = "http://mlflow:5000/a b;rm -rf /'\""
    cmd = build_entrypoint(sweep_id="s-1", python="/opt/py thon/bin/python", tracking_uri=uri)
    assert shlex.split(cmd) == [
        "/opt/py thon/bin/python",
        "-m",
        "critbatch",
        "run",
        "spec.yaml",
        "--output",
        "outputs/s-1",
        "--sweep-id",
        "s-1",
        "--address",
        "auto",
        "--no-progress",
        "--tracking-uri",
        uri,
    ]


@pytest.mark.parametrize("bad", ["", "-x", "a/b", "../x", "a b", "a;b", "x" * 129, "é", ".hidden"])
def test_sweep_ids_are_restricted(bad):
    with pytest.raises(InvalidInput):
        check_sweep_id(bad)
    with pytest.raises(InvalidInput):
        build_entrypoint(sweep_id=bad)


def test_default_sweep_id_is_name_and_fingerprint_and_stable():
    a, b = tiny(), tiny()
    assert default_sweep_id(a) == default_sweep_id(b) == f"tiny-{a.fingerprint()}"
    assert default_sweep_id(tiny(seeds=[1])) != default_sweep_id(a)


def test_working_dir_holds_only_code_spec_and_small_data(tmp_path):
    spec = tiny()
    st = stage_sweep(spec, tmp_path, base_dir=REPO, tracking_uri="http://mlflow:5000")
    files = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    tops = {f.split("/")[0] for f in files}
    assert tops == {"critbatch", "sweeps", "workloads", "service", "pyproject.toml", "spec.yaml", "inputs"}
    assert "critbatch/__main__.py" in files  # the entrypoint's `python -m critbatch`
    assert not any("__pycache__" in f or f.endswith(".pyc") or "/." in f or f.startswith(".") for f in files)
    assert "sweeps/remote/staging.py" in files and "sweeps/spec/sweep.py" in files and "workloads/__init__.py" in files
    # the data travelled, and the spec points at the shipped copy (relative to the job's working dir)
    shipped = yaml.safe_load((tmp_path / "spec.yaml").read_text())
    assert shipped["data"]["path"] == "inputs/data/input.txt"
    assert (tmp_path / "inputs/data/input.txt").read_bytes() == (REPO / "data/tinyshakespeare/input.txt").read_bytes()
    # everything else in the spec is unchanged
    again = parse_spec(shipped)
    assert again.model_dump(exclude={"data"}) == spec.model_dump(exclude={"data"})
    assert st.spec == again and st.fingerprint == spec.fingerprint()
    assert st.shipped == (("data.path", "data/tinyshakespeare/input.txt"),)
    assert st.size_bytes == sum((tmp_path / f).stat().st_size for f in files)
    # the job's arguments
    assert st.runtime_env["working_dir"] == str(tmp_path)
    assert st.runtime_env["env_vars"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert st.metadata == {
        "critbatch.sweep_id": default_sweep_id(spec),
        "critbatch.name": "tiny",
        "critbatch.fingerprint": spec.fingerprint(),
        "critbatch.experiment": "tiny",
        "critbatch.tracking_uri": "http://mlflow:5000",
        "critbatch.trials_planned": "2",
    }
    assert "--tracking-uri" in shlex.split(st.entrypoint) and st.warnings == ()


def test_tracking_uri_defaults_to_the_spec_with_a_warning_for_a_node_local_file(tmp_path):
    st = stage_sweep(tiny(), tmp_path, base_dir=REPO)
    assert st.tracking_uri == "sqlite:///mlflow.db"
    assert any("file on the cluster node" in w for w in st.warnings)


def test_data_too_big_to_ship_is_refused_with_the_field(tmp_path):
    stage = tmp_path / "stage"
    stage.mkdir()
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * 3000)
    with pytest.raises(StagingError) as e:
        stage_sweep(tiny(data={"path": str(big)}), stage, limits=StagingLimits(ship_data_max_bytes=2000))
    assert e.value.path == "data.path" and "--no-ship-data" in str(e.value)
    assert not (stage / "spec.yaml").exists()


def test_no_ship_data_sends_paths_as_they_are(tmp_path):
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * 3000)
    stage = tmp_path / "stage"
    stage.mkdir()
    st = stage_sweep(
        tiny(data={"path": str(big)}), stage, ship_data=False, limits=StagingLimits(ship_data_max_bytes=10)
    )
    assert st.spec.data.path == str(big) and st.shipped == ()
    assert not (stage / "inputs").exists()


def test_upload_limit_is_checked_before_upload(tmp_path):
    stage = tmp_path / "stage"
    stage.mkdir()
    with pytest.raises(StagingError) as e:
        stage_sweep(tiny(), stage, base_dir=REPO, limits=StagingLimits(upload_max_bytes=100_000))
    assert e.value.path == "<root>" and "upload limit" in str(e.value) and "inputs" in str(e.value)


def test_missing_or_remote_inputs_pass_through(tmp_path):
    st = stage_sweep(tiny(data={"path": "/mnt/shared/corpus.txt"}), tmp_path)
    assert st.spec.data.path == "/mnt/shared/corpus.txt" and st.shipped == ()
    assert not any("does not exist" in w for w in st.warnings)  # absolute: a cluster path, nothing to say
    stage2 = tmp_path / "2"
    stage2.mkdir()
    st2 = stage_sweep(tiny(data={"path": "nope/corpus.txt"}), stage2, base_dir=tmp_path)
    assert st2.spec.data.path == "nope/corpus.txt"
    assert any("does not exist here" in w for w in st2.warnings)


def test_data_root_confines_what_the_service_ships(tmp_path):
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "in.txt").write_text("hello " * 100)
    secret = tmp_path / "secret.txt"
    secret.write_text("do not ship")
    a = tmp_path / "a"
    a.mkdir()
    st = stage_sweep(tiny(data={"path": "d/in.txt"}), a, data_root=root)
    assert st.spec.data.path == "inputs/data/in.txt" and (a / "inputs/data/in.txt").exists()
    for i, path in enumerate([str(secret), "../secret.txt"]):
        b = tmp_path / f"b{i}"
        b.mkdir()
        st = stage_sweep(tiny(data={"path": path}), b, data_root=root)
        assert st.spec.data.path == path and not (b / "inputs").exists()


def test_tokenizer_directory_is_shipped_as_a_folder(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    (tok / "__pycache__").mkdir()
    (tok / "__pycache__" / "x.pyc").write_bytes(b"0")
    stage = tmp_path / "stage"
    stage.mkdir()
    st = stage_sweep(tiny(data={"path": str(REPO / "data/tinyshakespeare/input.txt"), "tokenizer": str(tok)}), stage)
    assert st.spec.data.tokenizer == "inputs/tokenizer"
    assert (stage / "inputs/tokenizer/tokenizer.json").exists() and not (
        stage / "inputs/tokenizer/__pycache__"
    ).exists()


def test_staged_sweep_removes_its_folder():
    with staged_sweep(tiny(), base_dir=REPO) as st:
        d = st.working_dir
        assert (d / "spec.yaml").exists()
    assert not d.exists()


def test_job_python_default(monkeypatch):
    monkeypatch.delenv("CRITBATCH_JOB_PYTHON", raising=False)
    import sys

    assert default_job_python("http://127.0.0.1:8265") == sys.executable
    assert default_job_python(None) == sys.executable
    assert default_job_python("http://ray-head.ns.svc:8265") == "python"
    monkeypatch.setenv("CRITBATCH_JOB_PYTHON", "/opt/conda/bin/python")
    assert default_job_python("http://127.0.0.1:8265") == "/opt/conda/bin/python"


def test_redact_uri():
    assert redact_uri("http://u:secret@h:5000/x") == "http://u:***@h:5000/x"
    assert redact_uri("http://h:5000") == "http://h:5000"
    assert redact_uri(None) is None


def test_job_tracking_uri_precedence():
    """flag > a server named in the spec > the environment's server > the spec's file store."""
    from sweeps.spec.identity import job_tracking_uri

    file_spec = tiny()  # sqlite:///mlflow.db: a file on the cluster node
    no_uri = tiny(tracking={})
    server_spec = tiny(tracking={"uri": "http://team-mlflow:5000"})
    assert job_tracking_uri(file_spec, "http://flag:1", "http://env:2") == "http://flag:1"
    assert job_tracking_uri(server_spec, None, "http://env:2") == "http://team-mlflow:5000"
    assert job_tracking_uri(file_spec, None, "http://env:2") == "http://env:2"
    assert job_tracking_uri(file_spec, None, None) == "sqlite:///mlflow.db"
    assert job_tracking_uri(no_uri, None, "http://env:2") == "http://env:2"
    assert job_tracking_uri(no_uri, None, None) == "sqlite:///mlflow.db"


def test_links_inside_a_shipped_folder_are_not_followed(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    secret = tmp_path / "secret.txt"
    secret.write_text("private")
    (tok / "leak.txt").symlink_to(secret)
    stage = tmp_path / "stage"
    stage.mkdir()
    stage_sweep(tiny(data={"path": str(REPO / "data/tinyshakespeare/input.txt"), "tokenizer": str(tok)}), stage)
    assert (stage / "inputs/tokenizer/tokenizer.json").exists()
    assert not (stage / "inputs/tokenizer/leak.txt").exists()


def test_a_model_hf_config_file_is_shipped_and_the_staged_spec_names_it(tmp_path):
    (tmp_path / "gqa.json").write_text('{"model_type": "llama", "num_key_value_heads": 2}')
    stage = tmp_path / "stage"
    stage.mkdir()
    st = stage_sweep(
        tiny(
            data={"path": str(REPO / "data/tinyshakespeare/input.txt")},
            model={"hf_config": str(tmp_path / "gqa.json"), "context_length_tokens": 32},
        ),
        stage,
    )
    assert st.spec.model.hf_config == "inputs/model/gqa.json"
    assert (stage / "inputs/model/gqa.json").read_text() == (tmp_path / "gqa.json").read_text()


def test_a_spec_whose_batch_size_folds_milestones_is_refused_at_staging(tmp_path):
    """Refused when staged (the service answers 422), not minutes later inside the Ray job."""
    d = tiny_spec()
    folded = tiny(
        budget_tokens=16384,
        eval={"milestones": 4, "eval_tokens": 1024},
        search={**d["search"], "batch_sizes_sequences": [4, 256]},
    )
    with pytest.raises(InvalidInput, match=r"batch size 256 \(8192 tokens per optimizer step\) reports at 2 of the 4 "):
        stage_sweep(folded, tmp_path)
    assert not any(tmp_path.iterdir())
