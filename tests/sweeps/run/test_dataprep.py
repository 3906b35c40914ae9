"""data.shards in the spec, its refusals at validation (exit 2, the field named), and the driver's
data step: a raw data.path prepared once per sweep (sweeps/run/dataprep.py), never by the workers."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from sweeps.errors import InvalidInput
from sweeps.launch.workload import workload_config
from sweeps.run.dataprep import PREPARED_DIR, prepared_shards
from sweeps.run.preflight import check_data_files, resolve_paths
from sweeps.spec import SpecError, parse_spec
from tests.conftest import ROOT, invoke_cli, run_cli, write_spec

SHAKESPEARE = ROOT / "data" / "tinyshakespeare" / "input.txt"


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """Tiny Shakespeare prepared by `critbatch prepare-data` (paragraphs as documents, byte tokenizer)."""
    out = tmp_path_factory.mktemp("shards") / "shakespeare"
    r = run_cli(
        [
            "prepare-data",
            str(SHAKESPEARE),
            "--output",
            str(out),
            "--text-documents",
            "paragraph",
            "--num-proc",
            "2",
            "--no-progress",
        ],
        timeout_s=300,
    )
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout and "uint16" in r.stdout
    return out


def _with_data(d: dict, data: dict) -> dict:
    d = copy.deepcopy(d)
    d["data"] = data
    return d


def test_exactly_one_of_path_and_shards(tiny_spec_dict, shards):
    for data in ({}, {"path": str(SHAKESPEARE), "shards": str(shards)}):
        with pytest.raises(SpecError) as err:
            parse_spec(_with_data(tiny_spec_dict, data))
        assert any(p == "data" and "exactly one of 'path'" in m for p, m in err.value.errors)
    s = parse_spec(_with_data(tiny_spec_dict, {"shards": str(shards)}))
    assert s.data.path is None and "path" not in s.model_dump()["data"]


def test_a_path_spec_dumps_as_before_so_its_fingerprint_is_unchanged(tiny_spec_dict):
    s = parse_spec(tiny_spec_dict)
    assert set(s.model_dump()["data"]) == {"path", "tokenizer", "validation_fraction"}


def test_shards_spec_validates_and_the_workers_get_the_shards(tiny_spec_dict, shards):
    s = parse_spec(_with_data(tiny_spec_dict, {"shards": str(shards)}))
    check_data_files(s)
    wc = workload_config(resolve_paths(s), data_path="ignored")
    assert wc.data.shards == str(shards) and wc.data.path is None
    assert prepared_shards(s, Path("/nonexistent"), "/nonexistent") is None  # the spec's own shards: nothing made


def _refused(spec: dict, tmp_path: Path, field: str, text: str) -> None:
    r = invoke_cli(["validate", str(write_spec(tmp_path, spec))])  # no Ray, no sweep: in this process
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{field}: " in r.stderr and text in r.stderr, r.stderr


def test_a_missing_or_damaged_index_is_refused_at_validation(tiny_spec_dict, tmp_path, shards):
    _refused(_with_data(tiny_spec_dict, {"shards": str(tmp_path / "none")}), tmp_path, "data.shards", "no shard index")
    bad = tmp_path / "bad"
    bad.mkdir()
    raw = json.loads((shards / "index.json").read_text())
    (bad / "index.json").write_text(json.dumps({**raw, "dtype": "uint32"}))
    for s in raw["shards"]:
        (bad / s["file"]).symlink_to(shards / s["file"])
    with pytest.raises(InvalidInput, match="data.shards: .*dtype 'uint32' does not match a vocabulary of 256"):
        check_data_files(parse_spec(_with_data(tiny_spec_dict, {"shards": str(bad)})))


def test_another_tokenizer_than_the_shards_is_refused(tiny_spec_dict, tmp_path, shards):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={"<unk>": 0, "<eos>": 1, "a": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>").save_pretrained(
        tmp_path / "tok"
    )
    with pytest.raises(
        InvalidInput, match=r"data.tokenizer: .* is not the tokenizer the shards were made with \('byte'"
    ):
        check_data_files(
            parse_spec(_with_data(tiny_spec_dict, {"shards": str(shards), "tokenizer": str(tmp_path / "tok")}))
        )


def test_a_model_embedding_smaller_than_the_shards_vocabulary_is_refused(tiny_spec_dict, tmp_path, shards):
    d = _with_data(tiny_spec_dict, {"shards": str(shards)})
    d["model"] = {
        "context_length_tokens": 32,
        "hf_config": {
            "model_type": "llama",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "vocab_size": 200,
        },
    }
    with pytest.raises(InvalidInput, match="vocab"):
        check_data_files(parse_spec(d))


def test_shards_too_short_for_a_window_and_finetune_with_shards_are_refused(tiny_spec_dict, shards):
    d = _with_data(tiny_spec_dict, {"shards": str(shards)})
    d["model"]["context_length_tokens"] = 2**19
    d["budget_tokens"] = 2**25
    with pytest.raises(InvalidInput, match="data.shards: the .* split holds .* fewer than one window"):
        check_data_files(parse_spec(d))
    ft = _with_data(tiny_spec_dict, {"shards": str(shards)})
    ft["workload"] = "finetune"
    ft["finetune"] = {"checkpoint_dir": "/nonexistent"}
    with pytest.raises(InvalidInput, match="data.shards: only pretraining reads prepared shards"):
        check_data_files(parse_spec(ft))


def test_the_driver_prepares_a_raw_file_once_and_a_second_call_writes_nothing(tiny_spec_dict, tmp_path, monkeypatch):
    import workloads.data.corpus

    calls = []
    real = workloads.data.corpus.encode_text
    monkeypatch.setattr(workloads.data.corpus, "encode_text", lambda text, tok: calls.append(tok) or real(text, tok))
    spec = resolve_paths(parse_spec(tiny_spec_dict))
    first = prepared_shards(spec, tmp_path, str(tmp_path))
    assert first == str(tmp_path / PREPARED_DIR) and len(calls) == 1
    stamp = (tmp_path / PREPARED_DIR / "index.json").stat().st_mtime_ns
    assert prepared_shards(spec, tmp_path, str(tmp_path)) == first and len(calls) == 1  # a resume: up to date
    assert (tmp_path / PREPARED_DIR / "index.json").stat().st_mtime_ns == stamp
    wc = workload_config(spec, data_path=spec.data.path, shards=first)
    assert wc.data.shards == first and wc.data.path == str(SHAKESPEARE)


@pytest.mark.slow
@pytest.mark.timeout(300)  # ~1 min idle
def test_a_sweep_on_a_raw_file_prepares_it_once_and_the_workers_read_only_the_shards(
    tiny_spec_dict, tmp_path, monkeypatch, ray_head, mlflow_uri
):
    """A real sweep (Ray Tune, Train, MLflow): the driver prepares data.path once, then the file is moved
    away; every trial still completes, so the workers read the shards, not the file."""
    import shutil

    from sweeps.run.api import run_sweep

    raw = tmp_path / "corpus.txt"
    shutil.copy(SHAKESPEARE, raw)
    d = _with_data(tiny_spec_dict, {"path": str(raw)})
    d["search"]["batch_sizes_sequences"] = [4, 8]  # 2 trials, run at once: both read while data.path is gone
    calls = []
    import workloads.api

    original = workloads.api.prepare_text_file

    def counting(*a, **kw):
        calls.append(a)
        res = original(*a, **kw)
        raw.rename(tmp_path / "moved.txt")  # from here on, nobody can read data.path
        return res

    monkeypatch.setattr(workloads.api, "prepare_text_file", counting, raising=False)  # what dataprep imports
    result = run_sweep(
        parse_spec(d),
        tmp_path / "out",
        tracking_uri=mlflow_uri,
        sweep_id="prep-once",
        show_progress=False,
        ray_address=ray_head.gcs_address,
    )
    assert len(calls) == 1
    trials = json.loads((tmp_path / "out" / "trials.json").read_text())
    statuses = [t["status"] for t in (trials["trials"] if isinstance(trials, dict) else trials)]
    assert result.ok and statuses == ["COMPLETED", "COMPLETED"], (result, statuses)
    index = json.loads((tmp_path / "out" / PREPARED_DIR / "index.json").read_text())
    assert index["split"]["method"] == "tail" and index["dtype"] == "uint16"


def test_with_a_uri_storage_root_the_shards_are_copied_there_and_read_back(tiny_spec_dict, tmp_path, monkeypatch):
    """resources.storage_path as a URI: ROOT/data is uploaded with fsspec; workers fetch it once per node."""
    from workloads.data.corpus import load_shard_corpus

    monkeypatch.setenv("CRITBATCH_DATA_CACHE", str(tmp_path / "cache"))
    spec = resolve_paths(parse_spec(tiny_spec_dict))
    root = "local://" + str(tmp_path / "store" / "sweep-1")
    uri = prepared_shards(spec, tmp_path / "out", root)
    assert uri == root + "/" + PREPARED_DIR
    assert (tmp_path / "store" / "sweep-1" / PREPARED_DIR / "index.json").is_file()
    local = load_shard_corpus(str(tmp_path / "out" / PREPARED_DIR), 32)
    remote = load_shard_corpus(uri, 32)
    assert len(remote.train_ids) == len(local.train_ids) and (tmp_path / "cache").is_dir()
    assert (remote.train_ids.read(1000, 64) == local.train_ids.read(1000, 64)).all()


def test_prepare_data_cli_exits_2_on_bad_input_and_writes_nothing(tmp_path):
    # refused before any work: in this process (a second interpreter cost a CLI start-up per call)
    r = invoke_cli(["prepare-data", str(tmp_path / "nothing*.txt"), "--output", str(tmp_path / "out"), "--no-progress"])
    assert r.returncode == 2 and "matches no file" in r.stderr, r.stderr
    (tmp_path / "a.jsonl").write_text('{"body": "x"}\n{"body": "y"}\n')
    r = invoke_cli(["prepare-data", str(tmp_path / "a.jsonl"), "--output", str(tmp_path / "out"), "--no-progress"])
    assert r.returncode == 2 and "has no column 'text'" in r.stderr and "--text-column" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl"]
