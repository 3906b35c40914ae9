"""Inputs pinned by content (``sweeps.store.inputs``): what is hashed, and the refusals on change (the gate of
every way back into a sweep: a resume, a retried job on shared storage)."""

from __future__ import annotations

import hashlib

import pytest

from sweeps.errors import InvalidInput
from sweeps.run.preflight import resolve_paths
from sweeps.spec import parse_spec
from sweeps.store.inputs import check_inputs_unchanged, content_sha256, pin_inputs


def test_a_file_is_its_bytes_and_a_folder_its_names_and_bytes(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(b"hello")
    assert content_sha256(f) == hashlib.sha256(b"hello").hexdigest()
    d = tmp_path / "tok"
    (d / "sub").mkdir(parents=True)
    (d / "tokenizer.json").write_text("{}")
    (d / "sub" / "x").write_text("1")
    before = content_sha256(d)
    (d / "sub" / "x").rename(d / "sub" / "y")  # same bytes, another name
    assert content_sha256(d) != before
    with pytest.raises(FileNotFoundError):
        content_sha256(tmp_path / "missing")


def _check(pinned, spec, tmp_path) -> None:
    """The resume's gate: ``spec``'s inputs now against ``pinned``."""
    check_inputs_unchanged(
        pinned, pin_inputs(resolve_paths(parse_spec(spec)), missing_ok=True), since=f"the sweep in {tmp_path} started"
    )


def test_the_spec_inputs_are_pinned_and_a_change_or_a_removal_is_refused(tmp_path, tiny_spec_dict):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 200)
    d = dict(tiny_spec_dict, data={"path": str(corpus)})
    pinned = pin_inputs(resolve_paths(parse_spec(d)))
    assert pinned == {"data.path": {"path": str(corpus), "sha256": hashlib.sha256(corpus.read_bytes()).hexdigest()}}
    _check(pinned, d, tmp_path)  # unchanged: passes
    _check(None, d, tmp_path)  # a sweep from before pinning: not checked
    old = pinned["data.path"]["sha256"]
    corpus.write_text(corpus.read_text() + "more")
    with pytest.raises(
        InvalidInput,
        match=rf"data.path {corpus} changed since the sweep in .* \(sha256 {old} then, "
        rf"[0-9a-f]{{64}} now\)",
    ):
        _check(pinned, d, tmp_path)
    corpus.unlink()
    with pytest.raises(InvalidInput, match=rf"data.path {corpus} is gone since the sweep"):
        _check(pinned, d, tmp_path)


def test_remote_inputs_are_recorded_unpinned(tmp_path, tiny_spec_dict):
    d = dict(tiny_spec_dict, data={"shards": "s3://bucket/corpus", "tokenizer": "byte"})
    pinned = pin_inputs(parse_spec(d))
    assert pinned == {"data.shards": {"path": "s3://bucket/corpus", "sha256": None}}
    check_inputs_unchanged(pinned, pin_inputs(parse_spec(d)), since="then")


def test_a_shard_rewritten_under_an_unchanged_index_is_refused(tmp_path, tiny_spec_dict):
    """The index pins the shards' hashes, but a shard file rewritten in place (same size,
    the index untouched) used to pass the resume check, so its remaining trials would train on other data."""
    import json
    import os

    folder = tmp_path / "shards"
    folder.mkdir()
    shard = folder / "train-00000.bin"
    shard.write_bytes(bytes(range(256)) * 4)
    (folder / "index.json").write_text(
        json.dumps(
            {
                "shards": [
                    {"file": shard.name, "split": "train", "sha256": hashlib.sha256(shard.read_bytes()).hexdigest()}
                ]
            }
        )
    )
    d = dict(tiny_spec_dict, data={"shards": str(folder)})
    pinned = pin_inputs(resolve_paths(parse_spec(d)))
    assert set(pinned) == {"data.shards", "data.shards files"}
    assert pinned["data.shards files"]["files"][shard.name]["bytes"] == 1024
    _check(pinned, d, tmp_path)
    os.utime(shard, ns=(1, 1))  # touched, same bytes: hashed, matches its index, passes
    _check(pinned, d, tmp_path)
    shard.write_bytes(bytes(reversed(range(256))) * 4)  # same size, other content
    with pytest.raises(
        InvalidInput,
        match=rf"data.shards {shard} changed since the sweep in .* \(sha256 [0-9a-f]{{64}} "
        rf"in its index, [0-9a-f]{{64}} now\)",
    ):
        _check(pinned, d, tmp_path)
    shard.unlink()
    with pytest.raises(InvalidInput, match=rf"data.shards {shard} is gone since the sweep"):
        _check(pinned, d, tmp_path)


def _inputs_at(folder, *, vocab: int = 300, intermediate: int = 64):
    """A corpus, a tokenizer folder and a ``config.json`` in ``folder``; the spec fields naming them."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.txt").write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 200)
    (folder / "tok").mkdir(exist_ok=True)
    (folder / "tok" / "tokenizer.json").write_text(json.dumps({"model": {"vocab_size": vocab}}))
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 32,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "intermediate_size": intermediate,
            }
        )
    )
    return {
        "data": {"path": str(folder / "corpus.txt"), "tokenizer": str(folder / "tok")},
        "model": {"hf_config": str(folder / "config.json"), "context_length_tokens": 32},
    }


def _pin(tiny_spec_dict, fields):
    spec = parse_spec(dict(tiny_spec_dict, **fields))
    return pin_inputs(resolve_paths(spec), hf_config_from=spec.model.hf_config, missing_ok=True)


def test_the_pinned_inputs_follow_their_content_not_their_path(tmp_path, tiny_spec_dict):
    """A retried job reads its inputs at another path (a new working directory): same content, same pins;
    a changed tokenizer and model config (the operator's retry: vocab 300 -> 400, intermediate_size 64 -> 128)
    are both named, each with both hashes."""
    first = _pin(tiny_spec_dict, _inputs_at(tmp_path / "a"))
    assert set(first) == {"data.path", "data.tokenizer", "model.hf_config"}
    moved = _pin(tiny_spec_dict, _inputs_at(tmp_path / "b"))
    assert {k: r["sha256"] for k, r in moved.items()} == {k: r["sha256"] for k, r in first.items()}
    assert moved["data.path"]["path"] != first["data.path"]["path"]
    check_inputs_unchanged(first, moved, since="then")  # content, not path: passes
    changed = _pin(tiny_spec_dict, _inputs_at(tmp_path / "b", vocab=400, intermediate=128))
    assert changed["data.path"] == moved["data.path"]
    with pytest.raises(InvalidInput) as exc:
        check_inputs_unchanged(first, changed, since="sweep 'x' started")
    msg = str(exc.value)
    for field in ("data.tokenizer", "model.hf_config"):
        assert (
            f"{field} {changed[field]['path']} changed since sweep 'x' started (sha256 {first[field]['sha256']} "
            f"then, {changed[field]['sha256']} now)"
        ) in msg, msg
    assert "data.path" not in msg
    # a config file rewritten with the same content in another layout is the same model
    cfg = tmp_path / "b" / "config.json"
    import json

    cfg.write_text(json.dumps(dict(reversed(list(json.loads(cfg.read_text()).items()))), indent=4))
    assert (
        _pin(tiny_spec_dict, {"model": {"hf_config": str(cfg), "context_length_tokens": 32}})["model.hf_config"][
            "sha256"
        ]
        == changed["model.hf_config"]["sha256"]
    )


def test_an_hf_config_read_into_spec_yaml_pins_the_same_on_resume(tmp_path, tiny_spec_dict):
    """A path is read once into OUT/spec.yaml; the resume pins the mapping it reads back there, alike."""
    import yaml

    from sweeps.spec import parse_stored_spec

    pinned = _pin(tiny_spec_dict, _inputs_at(tmp_path / "a"))
    spec = resolve_paths(parse_spec(dict(tiny_spec_dict, **_inputs_at(tmp_path / "a"))))
    stored = parse_stored_spec(yaml.safe_load(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)))
    now = pin_inputs(stored, hf_config_from="OUT/spec.yaml", missing_ok=True)
    assert now["model.hf_config"]["sha256"] == pinned["model.hf_config"]["sha256"]
    check_inputs_unchanged(pinned, now, since="then")


def test_a_retried_job_is_checked_against_the_inputs_its_storage_root_recorded(tmp_path, tiny_spec_dict):
    """`critbatch run --sweep-id X` whose shared storage root holds sweep X (a retried job, the REST service's
    and the KubeRay entrypoint's) is refused before anything is created when an input changed; unchanged, it
    prepares as before, with the inputs it will record; a root recorded before inputs were is not checked."""
    from sweeps.run.prepare import prepare_sweep
    from sweeps.store.claims import write_storage_binding

    fields = _inputs_at(tmp_path / "in")
    d = dict(
        tiny_spec_dict,
        data={"path": fields["data"]["path"]},
        resources={**tiny_spec_dict.get("resources", {}), "storage_path": str(tmp_path / "storage")},
    )
    uri = f"sqlite:///{tmp_path}/ml.db"
    first = prepare_sweep(parse_spec(d), tmp_path / "out1", tracking_uri=uri, sweep_id="retry-1")
    assert first.shared_storage and set(first.inputs) == {"data.path"}
    root = first.storage_root
    write_storage_binding(root, "retry-1", first.fingerprint, first.inputs)
    again = prepare_sweep(parse_spec(d), tmp_path / "out2", tracking_uri=uri, sweep_id="retry-1")
    assert again.inputs == first.inputs
    corpus = tmp_path / "in" / "corpus.txt"
    corpus.write_text(corpus.read_text() + "ROMEO:\nA line the first trials never saw.\n")
    now, then = hashlib.sha256(corpus.read_bytes()).hexdigest(), first.inputs["data.path"]["sha256"]
    with pytest.raises(
        InvalidInput,
        match=rf"data.path {corpus} changed since sweep 'retry-1' started \(recorded in "
        rf"{root}/critbatch-sweep.json\) \(sha256 {then} then, {now} now\).*"
        rf"another --sweep-id",
    ):
        prepare_sweep(parse_spec(d), tmp_path / "out2", tracking_uri=uri, sweep_id="retry-1")
    assert not (tmp_path / "out2").exists()
    write_storage_binding(root, "retry-1", first.fingerprint)  # a root from before inputs were recorded
    assert (
        prepare_sweep(parse_spec(d), tmp_path / "out2", tracking_uri=uri, sweep_id="retry-1").inputs["data.path"][
            "sha256"
        ]
        == now
    )
