"""``critbatch prepare-data`` throughput against the tokenizer's own batch-encode speed.

    python benchmarks/prepare_throughput.py [--mb 64] [--files 8] [--vocab 8192] [--num-proc N] [--dir DIR]

A corpus of ``--mb`` MB in ``--files`` JSON Lines files (Tiny Shakespeare's paragraphs, repeated,
one document each) and a byte-level BPE tokenizer of ``--vocab`` ids trained on Tiny Shakespeare
with ``tokenizers`` (a fast tokenizer with an EOS token, saved as a Hugging Face folder). Then, on
the same machine and cores:

* **baseline**: the tokenizer's own batch encode, ``tokenizers.Tokenizer.encode_batch_fast`` over
  every document already in memory, with its Rust thread pool on every core this process may use
  (``TOKENIZERS_PARALLELISM=true``, ``RAYON_NUM_THREADS`` = cores) and no file I/O at all;
* **prepare-data**: ``workloads.data.prepare.prepare_data`` end to end (hashing the inputs, reading them
  with pyarrow, choosing the held-out documents, tokenizing in ``--num-proc`` processes, writing
  and hashing the shards, the index), timed from the call to its return.

The last line is ``ratio=X``: prepare-data's tokens/s over the baseline's (goal X >= 0.8).
Not measured: Parquet input, corpora larger than memory, the byte tokenizer (no BPE work: see the
``byte`` line, where prepare-data is compared with the HF byte tokenizer's batch encode).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_corpus(folder: Path, mb: int, files: int) -> list[str]:
    """``files`` JSON Lines files of ~``mb`` MB in all, one paragraph of Tiny Shakespeare a document."""
    paras = [p for p in (ROOT / "data" / "tinyshakespeare" / "input.txt").read_text().split("\n\n") if p.strip()]
    folder.mkdir(parents=True, exist_ok=True)
    per_file, out = mb * 2**20 // files, []
    for k in range(files):
        path = folder / f"part-{k:03d}.jsonl"
        out.append(str(path))
        if path.is_file():
            continue
        lines, size, i = [], 0, k
        while size < per_file:
            line = json.dumps({"text": f"{i}. " + paras[i % len(paras)]}) + "\n"
            lines.append(line)
            size, i = size + len(line), i + files
        path.write_text("".join(lines))
    return out


def make_tokenizer(folder: Path, vocab: int) -> Path:
    """A byte-level BPE of ``vocab`` ids trained on Tiny Shakespeare, saved for ``AutoTokenizer``."""
    if (folder / "tokenizer.json").is_file():
        return folder
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train(
        [str(ROOT / "data" / "tinyshakespeare" / "input.txt")],
        trainers.BpeTrainer(
            vocab_size=vocab, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(folder)
    return folder


def baseline(files: list[str], tokenizer: Path | None) -> tuple[int, float]:
    """``(tokens, seconds)`` of the tokenizer's own batch encode over every document in memory."""
    import pyarrow.json as pj

    docs = [t for f in files for t in pj.read_json(f).column("text").to_pylist()]
    if tokenizer is None:
        from workloads.data.tokenizer import byte_tokenizer

        tok = byte_tokenizer().backend_tokenizer
    else:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    t = time.perf_counter()
    enc = tok.encode_batch_fast(docs, add_special_tokens=False)
    dt = time.perf_counter() - t
    return sum(len(e.ids) for e in enc) + len(docs), dt  # + one EOS a document, as prepare-data writes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--num-proc", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--dir", default="/tmp/critbatch-prepare-bench")
    a = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    os.environ.update(TOKENIZERS_PARALLELISM="true", RAYON_NUM_THREADS=str(cores))
    from workloads.data.prepare import prepare_data

    base = Path(a.dir)
    files = make_corpus(base / f"corpus-{a.mb}mb-{a.files}", a.mb, a.files)
    results = {}
    for name, tok in (("bpe", make_tokenizer(base / f"bpe-{a.vocab}", a.vocab)), ("byte", None)):
        b_tokens, b_s = baseline(files, tok)
        out = base / f"out-{name}"
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        res = prepare_data(files, out, tokenizer=str(tok) if tok else "byte", num_proc=a.num_proc)
        p_s = time.perf_counter() - t
        p_tokens = res.index["totals"]["train"]["tokens"] + res.index["totals"]["validation"]["tokens"]
        results[name] = (p_tokens / p_s) / (b_tokens / b_s)
        print(
            f"{name}: {a.mb} MB in {a.files} JSON Lines files, {cores} cores: tokenizer batch encode "
            f"{b_tokens / b_s / 1e6:.2f} M tokens/s ({b_tokens} tokens, {b_s:.2f} s); prepare-data "
            f"--num-proc {a.num_proc} {p_tokens / p_s / 1e6:.2f} M tokens/s ({p_tokens} tokens, {p_s:.2f} s, "
            f"{res.index['dtype']}); ratio {results[name]:.3f}",
            flush=True,
        )
    print(f"ratio={results['bpe']:.3f}")


if __name__ == "__main__":
    main()
