"""Inputs pinned by content (``sweeps.run.inputs``): what is hashed, and the refusals on change."""

from __future__ import annotations

import hashlib

import pytest

from sweeps.errors import InvalidInput
from sweeps.run.inputs import check_inputs_unchanged, content_sha256, pin_inputs
from sweeps.run.preflight import resolve_paths
from sweeps.spec import parse_spec


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


def test_the_spec_inputs_are_pinned_and_a_change_or_a_removal_is_refused(tmp_path, tiny_spec_dict):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 200)
    d = dict(tiny_spec_dict, data={"path": str(corpus)})
    pinned = pin_inputs(resolve_paths(parse_spec(d)))
    assert pinned == {"data.path": {"path": str(corpus), "sha256": hashlib.sha256(corpus.read_bytes()).hexdigest()}}
    check_inputs_unchanged(pinned, tmp_path)  # unchanged: passes
    check_inputs_unchanged(None, tmp_path)  # a sweep from before pinning: not checked
    old = pinned["data.path"]["sha256"]
    corpus.write_text(corpus.read_text() + "more")
    with pytest.raises(InvalidInput, match=rf"data.path {corpus} changed since the sweep in .* \(sha256 {old} then, "
                                           rf"[0-9a-f]{{64}} now\)"):
        check_inputs_unchanged(pinned, tmp_path)
    corpus.unlink()
    with pytest.raises(InvalidInput, match=rf"data.path {corpus} is gone since the sweep"):
        check_inputs_unchanged(pinned, tmp_path)


def test_remote_inputs_are_recorded_unpinned(tmp_path, tiny_spec_dict):
    d = dict(tiny_spec_dict, data={"shards": "s3://bucket/corpus", "tokenizer": "byte"})
    pinned = pin_inputs(parse_spec(d))
    assert pinned == {"data.shards": {"path": "s3://bucket/corpus", "sha256": None}}
    check_inputs_unchanged(pinned, tmp_path)


def test_a_shard_rewritten_under_an_unchanged_index_is_refused(tmp_path, tiny_spec_dict):
    """Issue 30, the kind: the index pins the shards' hashes, but a shard file rewritten in place (same size,
    the index untouched) used to pass the resume check, so its remaining trials would train on other data."""
    import json
    import os

    folder = tmp_path / "shards"
    folder.mkdir()
    shard = folder / "train-00000.bin"
    shard.write_bytes(bytes(range(256)) * 4)
    (folder / "index.json").write_text(json.dumps(
        {"shards": [{"file": shard.name, "split": "train", "sha256": hashlib.sha256(shard.read_bytes()).hexdigest()}]}))
    pinned = pin_inputs(resolve_paths(parse_spec(dict(tiny_spec_dict, data={"shards": str(folder)}))))
    assert set(pinned) == {"data.shards", "data.shards files"}
    assert pinned["data.shards files"]["files"][shard.name]["bytes"] == 1024
    check_inputs_unchanged(pinned, tmp_path)
    os.utime(shard, ns=(1, 1))  # touched, same bytes: hashed, matches its index, passes
    check_inputs_unchanged(pinned, tmp_path)
    shard.write_bytes(bytes(reversed(range(256))) * 4)  # same size, other content
    with pytest.raises(InvalidInput, match=rf"data.shards {shard} changed since the sweep in .* \(sha256 [0-9a-f]{{64}} "
                                           rf"in its index, [0-9a-f]{{64}} now\)"):
        check_inputs_unchanged(pinned, tmp_path)
    shard.unlink()
    with pytest.raises(InvalidInput, match=rf"data.shards {shard} is gone since the sweep"):
        check_inputs_unchanged(pinned, tmp_path)
