"""workloads.data.prepare and workloads.data.shards: tokenizing into shards, the index, the document split,
re-runs, refusals, and the memory-mapped stream the workers read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.conftest import ROOT
from workloads.data.corpus import load_corpus, load_shard_corpus, validation_batches, window_batch
from workloads.errors import DataError
from workloads.data.prepare import prepare_data, prepare_text_file, tokenizer_identity
from workloads.data.shards import INDEX_FILE, TokenStream, check_index, dtype_for_vocab, file_sha256, open_split, read_index

SHAKESPEARE = ROOT / "data" / "tinyshakespeare" / "input.txt"


def _docs(n: int = 40) -> list[str]:
    return [f"document {i}: " + "word " * (i % 7 + 1) + "ünïcode" for i in range(n)]


def _hf_tokenizer(folder: Path, vocab_size: int | None = None) -> Path:
    """A small fast tokenizer with an EOS token: BPE trained on the docs, or a WordLevel of ``vocab_size`` ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size is None:
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.train_from_iterator(_docs(), trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>"],
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    else:
        vocab = {"<unk>": 0, "<eos>": 1, **{f"w{i}": i + 2 for i in range(vocab_size - 2)}}
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>").save_pretrained(folder)
    return folder


def _jsonl(path: Path, docs: list[str], column: str = "text") -> Path:
    path.write_text("".join(json.dumps({column: d, "id": i}) + "\n" for i, d in enumerate(docs)), encoding="utf-8")
    return path


def _stream_tokens(folder, split: str) -> np.ndarray:
    s = open_split(read_index(str(folder)), split)
    return s.read(0, len(s))


def test_index_round_trip_and_memmap_reads_the_tokens_written(tmp_path):
    docs = _docs()
    res = prepare_data([str(_jsonl(tmp_path / "a.jsonl", docs))], tmp_path / "out", num_proc=1)
    index = read_index(str(tmp_path / "out"))
    assert index.raw == json.loads((tmp_path / "out" / INDEX_FILE).read_text()) == res.index
    assert index.dtype == np.uint16 and index.vocab_size == 256 and index.raw["split"]["method"] == "documents"
    for s in index.raw["shards"]:
        assert file_sha256(tmp_path / "out" / s["file"]) == s["sha256"]
    held = set()
    val = _stream_tokens(tmp_path / "out", "validation").astype(np.uint8).tobytes().decode()
    train = _stream_tokens(tmp_path / "out", "train").astype(np.uint8).tobytes().decode()
    for d in docs:
        assert (d + "\n" in val) != (d + "\n" in train)  # every document in exactly one split
        held |= {d} if d + "\n" in val else set()
    assert len(held) == round(0.1 * len(docs)) == index.raw["totals"]["validation"]["documents"]
    assert index.raw["totals"]["train"]["documents"] == len(docs) - len(held)


def test_held_out_documents_are_fixed_by_the_seed_not_the_processes_or_the_tail(tmp_path):
    files = []
    for k in range(4):
        files.append(str(_jsonl(tmp_path / f"part{k}.jsonl", _docs(30)[k::4])))
    a = prepare_data(files, tmp_path / "a", seed=1, num_proc=1, validation_fraction=0.2)
    b = prepare_data(files, tmp_path / "b", seed=1, num_proc=2, validation_fraction=0.2)
    prepare_data(files, tmp_path / "c", seed=2, num_proc=1, validation_fraction=0.2)
    assert np.array_equal(_stream_tokens(tmp_path / "a", "validation"), _stream_tokens(tmp_path / "b", "validation"))
    assert [s["sha256"] for s in a.index["shards"]] == [s["sha256"] for s in b.index["shards"]]
    assert not np.array_equal(_stream_tokens(tmp_path / "a", "validation"), _stream_tokens(tmp_path / "c", "validation"))
    assert a.index["split"] == {"method": "documents", "seed": 1, "validation_fraction": 0.2}


def test_rerun_on_the_same_inputs_is_a_no_op_and_a_changed_input_rebuilds(tmp_path):
    src = _jsonl(tmp_path / "a.jsonl", _docs())
    first = prepare_data([str(src)], tmp_path / "out", num_proc=1)
    mtimes = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()}
    again = prepare_data([str(src)], tmp_path / "out", num_proc=1)
    assert again.up_to_date and not first.up_to_date
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()} == mtimes
    _jsonl(src, _docs() + ["one more document"])
    third = prepare_data([str(src)], tmp_path / "out", num_proc=1)
    assert not third.up_to_date and third.index["inputs_sha256"] != first.index["inputs_sha256"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp folder left


def test_a_damaged_shard_is_rebuilt(tmp_path):
    src = _jsonl(tmp_path / "a.jsonl", _docs())
    prepare_data([str(src)], tmp_path / "out", num_proc=1)
    shard = tmp_path / "out" / "train-00000.bin"
    shard.write_bytes(b"\x00\x00" + shard.read_bytes()[2:])
    assert not prepare_data([str(src)], tmp_path / "out", num_proc=1).up_to_date


def test_uint16_when_the_vocabulary_fits_else_uint32(tmp_path):
    assert dtype_for_vocab(256) == np.uint16 and dtype_for_vocab(65536) == np.uint16
    assert dtype_for_vocab(65537) == np.uint32
    big = _hf_tokenizer(tmp_path / "tok", vocab_size=70000)
    docs = [f"w{i} w69990 w{i * 1000}" for i in range(20)]
    res = prepare_data([str(_jsonl(tmp_path / "a.jsonl", docs))], tmp_path / "out", tokenizer=str(big), num_proc=1)
    assert res.index["dtype"] == "uint32" and res.index["vocab_size"] == 70000
    ids = np.concatenate([_stream_tokens(tmp_path / "out", "train"), _stream_tokens(tmp_path / "out", "validation")])
    assert ids.max() == 69992 and (ids == 1).sum() == 20  # w69990 = id 69992; one EOS per document


def test_hf_tokenizer_batch_encodes_documents_with_eos_like_the_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    folder = _hf_tokenizer(tmp_path / "tok")
    docs = _docs(12)
    res = prepare_data([str(_jsonl(tmp_path / "a.jsonl", docs))], tmp_path / "out", tokenizer=str(folder),
                       num_proc=1, validation_fraction=0.25)
    tok = AutoTokenizer.from_pretrained(folder)
    ident = tokenizer_identity(str(folder))
    assert res.index["tokenizer"]["sha256"] == ident["sha256"] and ident["eos_token_id"] == tok.eos_token_id
    expected = [t for d in docs for t in tok(d, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]]
    got = np.concatenate([_stream_tokens(tmp_path / "out", "train"), _stream_tokens(tmp_path / "out", "validation")])
    assert sorted(got.tolist()) == sorted(expected)  # same tokens; the split reorders documents
    assert res.index["totals"]["train"]["tokens"] + res.index["totals"]["validation"]["tokens"] == len(expected)


def test_text_files_and_parquet_inputs(tmp_path):
    docs = _docs(10)
    for i, d in enumerate(docs):
        (tmp_path / f"t{i}.txt").write_text(d, encoding="utf-8")
    text = prepare_data([str(tmp_path / "t*.txt")], tmp_path / "text", num_proc=2)
    assert text.index["input_format"] == "text" and text.index["totals"]["train"]["documents"] == 9
    table = pa.table({"body": docs})
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=4)  # 3 row groups: 3 units
    par = prepare_data([str(tmp_path / "d.parquet")], tmp_path / "par", text_column="body", num_proc=1)
    assert par.index["input_format"] == "parquet" and par.index["totals"]["train"]["shards"] == 3
    assert sorted(_stream_tokens(tmp_path / "par", "train").tolist()) != []
    both = sorted(np.concatenate([_stream_tokens(tmp_path / "text", s) for s in ("train", "validation")]).tolist())
    assert both == sorted(np.concatenate([_stream_tokens(tmp_path / "par", s) for s in ("train", "validation")]).tolist())


def test_line_documents_are_the_non_blank_lines_without_their_line_endings(tmp_path):
    """``--text-documents line`` (the WikiText example's CRLF file): a document a line, ``\\r\\n`` or ``\\n`` dropped."""
    (tmp_path / "a.txt").write_bytes(b" = Title = \r\n first line \r\n\r\n  \r\nsecond line\nthird\r\n")
    res = prepare_data([str(tmp_path / "a.txt")], tmp_path / "out", text_documents="line", num_proc=1,
                       validation_fraction=0.25)
    assert res.index["totals"]["train"]["documents"] == 3 and res.index["totals"]["validation"]["documents"] == 1
    text = b"".join(_stream_tokens(tmp_path / "out", s).astype(np.uint8).tobytes() for s in ("train", "validation"))
    assert sorted(text.decode().split("\n")[:-1]) == sorted([" = Title = ", " first line ", "second line", "third"])
    with pytest.raises(DataError, match="use 'file', 'paragraph' or 'line'"):
        prepare_data([str(tmp_path / "a.txt")], tmp_path / "other", text_documents="lines")


@pytest.mark.parametrize("case, message", [
    ("no_match", "matches no file"),
    ("empty", "is empty"),
    ("mixed", "mix formats"),
    ("no_column", "no column 'text'"),
    ("bad_json", "is not JSON Lines"),
    ("not_utf8", "is not UTF-8"),
    ("one_doc", "at least 2"),
    ("bad_tokenizer", "tokenizer"),
    ("foreign_output", "not a prepared-data folder"),
])
def test_bad_input_is_refused_and_leaves_nothing(tmp_path, case, message):
    out = tmp_path / "out"
    inputs = [str(_jsonl(tmp_path / "a.jsonl", _docs(5)))]
    kw = {}
    if case == "no_match":
        inputs = [str(tmp_path / "*.nope")]
    elif case == "empty":
        (tmp_path / "e.txt").write_text("")
        inputs = [str(tmp_path / "e.txt")]
    elif case == "mixed":
        (tmp_path / "x.txt").write_text("x")
        inputs.append(str(tmp_path / "x.txt"))
    elif case == "no_column":
        inputs = [str(_jsonl(tmp_path / "b.jsonl", _docs(5), column="body"))]
    elif case == "bad_json":
        (tmp_path / "c.jsonl").write_text('{"text": "a"}\n{not json\n')
        inputs = [str(tmp_path / "c.jsonl")]
    elif case == "not_utf8":
        (tmp_path / "d.txt").write_bytes(b"\xff\xfe\xfa")
        (tmp_path / "d2.txt").write_bytes(b"fine")
        inputs = [str(tmp_path / "d*.txt")]
    elif case == "one_doc":
        (tmp_path / "one.txt").write_text("only one document")
        inputs = [str(tmp_path / "one.txt")]
    elif case == "bad_tokenizer":
        (tmp_path / "tok").mkdir()
        kw["tokenizer"] = str(tmp_path / "tok")
    elif case == "foreign_output":
        out.mkdir()
        (out / "precious.txt").write_text("keep me")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(DataError, match=message):
        prepare_data(inputs, out, num_proc=2, **kw)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing half-written, no temp folder
    if case == "foreign_output":
        assert (out / "precious.txt").read_text() == "keep me"


def test_raw_text_file_shards_draw_the_same_batches_as_the_text_file(tmp_path):
    """The driver's data.path preparation keeps the training draw bit-identical (the main job's trials)."""
    res = prepare_text_file(SHAKESPEARE, tmp_path / "data")
    assert res.index["split"]["method"] == "tail" and prepare_text_file(SHAKESPEARE, tmp_path / "data").up_to_date
    old = load_corpus(str(SHAKESPEARE), "byte", 0.1, 64)
    new = load_shard_corpus(str(tmp_path / "data"), 64)
    assert len(new.train_ids) == len(old.train_ids) and len(new.val_ids) == len(old.val_ids)
    for step in (0, 1, 17, 1000):
        for start, count in ((0, 16), (16, 16)):
            a = window_batch(old.train_ids, seed=3, step=step, global_batch_size_sequences=32, context_length_tokens=64,
                             start=start, count=count)
            b = window_batch(new.train_ids, seed=3, step=step, global_batch_size_sequences=32, context_length_tokens=64,
                             start=start, count=count)
            assert all(torch.equal(x, y) and y.dtype == torch.int64 for x, y in zip(a, b))
    va = validation_batches(old.val_ids, eval_tokens=8192, context_length_tokens=64, batch_size_sequences=64)
    vb = validation_batches(new.val_ids, eval_tokens=8192, context_length_tokens=64, batch_size_sequences=64)
    assert all(torch.equal(x, y) for p, q in zip(va, vb) for x, y in zip(p, q)) and len(va) == len(vb)


def test_token_stream_reads_across_shard_boundaries():
    parts = [np.arange(0, 5, dtype=np.uint16), np.arange(5, 6, dtype=np.uint16), np.arange(6, 20, dtype=np.uint16)]
    s = TokenStream(parts)
    assert len(s) == 20 and s.read(3, 10).tolist() == list(range(3, 13))
    assert s.gather([0, 4, 15], 5).tolist() == [list(range(o, o + 5)) for o in (0, 4, 15)]
    with pytest.raises(IndexError):
        s.read(18, 5)


def test_check_index_refusals(tmp_path):
    prepare_data([str(_jsonl(tmp_path / "a.jsonl", _docs()))], tmp_path / "out", num_proc=1)
    index = read_index(str(tmp_path / "out"))
    byte = tokenizer_identity("byte")["sha256"]
    check_index(index, tokenizer_sha256=byte, tokenizer_name="byte", model_vocab_size=256, min_tokens=33)
    with pytest.raises(DataError, match="data.tokenizer: .* is not the tokenizer the shards were made with"):
        check_index(index, tokenizer_sha256="0" * 64, tokenizer_name="other", model_vocab_size=256, min_tokens=33)
    with pytest.raises(DataError, match=r"data.shards: the shards' vocabulary \(256.*larger than the model's embedding \(200"):
        check_index(index, tokenizer_sha256=byte, tokenizer_name="byte", model_vocab_size=200, min_tokens=33)
    with pytest.raises(DataError, match="data.shards: the train split holds .* fewer than one window"):
        check_index(index, tokenizer_sha256=byte, tokenizer_name="byte", model_vocab_size=256, min_tokens=10**6)


@pytest.mark.parametrize("damage, message", [
    ("no_index", "no shard index"),
    ("bad_json", "not readable JSON"),
    ("format", "format is"),
    ("dtype", "dtype 'uint32' does not match a vocabulary of 256"),
    ("missing_shard", "is missing"),
    ("short_shard", "holds .* bytes, the index says"),
])
def test_read_index_refuses_a_bad_index(tmp_path, damage, message):
    prepare_data([str(_jsonl(tmp_path / "a.jsonl", _docs()))], tmp_path / "out", num_proc=1)
    idx_file = tmp_path / "out" / INDEX_FILE
    raw = json.loads(idx_file.read_text())
    if damage == "no_index":
        idx_file.unlink()
    elif damage == "bad_json":
        idx_file.write_text("{")
    elif damage == "format":
        idx_file.write_text(json.dumps({**raw, "format": "other/9"}))
    elif damage == "dtype":
        idx_file.write_text(json.dumps({**raw, "dtype": "uint32"}))
    elif damage == "missing_shard":
        (tmp_path / "out" / raw["shards"][0]["file"]).unlink()
    elif damage == "short_shard":
        f = tmp_path / "out" / raw["shards"][0]["file"]
        f.write_bytes(f.read_bytes()[:-2])
    with pytest.raises(DataError, match=message):
        read_index(str(tmp_path / "out"))


def test_fsspec_uri_is_fetched_once_into_the_node_cache(tmp_path, monkeypatch):
    prepare_data([str(_jsonl(tmp_path / "a.jsonl", _docs()))], tmp_path / "out", num_proc=1)
    monkeypatch.setenv("CRITBATCH_DATA_CACHE", str(tmp_path / "cache"))
    uri = f"file://{tmp_path / 'out'}"
    from workloads.data import shards

    remote = shards.read_index("local://" + str(tmp_path / "out"), fetch=False)
    assert remote.root is None and remote.tokens("train") == len(_stream_tokens(tmp_path / "out", "train"))
    corpus = load_shard_corpus("local://" + str(tmp_path / "out"), 8)
    cached = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    assert len(cached) == 1 and (cached[0] / ".complete").is_file()
    assert np.array_equal(corpus.train_ids.read(0, len(corpus.train_ids)), _stream_tokens(tmp_path / "out", "train"))
    stamp = (cached[0] / ".complete").stat().st_mtime_ns
    load_shard_corpus("local://" + str(tmp_path / "out"), 8)
    assert (cached[0] / ".complete").stat().st_mtime_ns == stamp  # not fetched again
    assert read_index(uri).root == tmp_path / "out"  # file:// is read in place


def test_a_trial_on_the_prepared_raw_file_reports_exactly_what_it_did_on_the_text_file(tmp_path):
    """The main job's numbers do not move: same losses, bit for bit, from shards as from the text file."""
    from tests.workloads.train.test_loop import BASE, run
    from tests.workloads.trial import with_sections

    prepare_text_file(SHAKESPEARE, tmp_path / "data")
    _, before = run(BASE)
    _, after = run(with_sections(BASE, data={"path": None, "shards": str(tmp_path / "data")}))
    keys = ("tokens_seen", "val_loss", "val_loss_raw", "train_loss")
    assert [[m[k] for k in keys] for m, _ in before] == [[m[k] for k in keys] for m, _ in after]
    assert len(before) == 4
