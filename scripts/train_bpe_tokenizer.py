"""Train a small byte-level BPE tokenizer with Hugging Face ``tokenizers`` and save it as a fast tokenizer
folder that ``critbatch prepare-data --tokenizer`` and ``data.tokenizer`` accept.

The committed ``data/wikitext-2-raw/bpe-2048/`` was made by (about 2 s on one core)::

    .venv/bin/python scripts/train_bpe_tokenizer.py data/wikitext-2-raw/wiki.test.raw \\
        --vocab-size 2048 --output data/wikitext-2-raw/bpe-2048

The documents are the input's non-blank lines without their line endings, exactly what
``critbatch prepare-data --text-documents line`` tokenizes, so the tokenizer never sees a ``\\r``.
The model: GPT-2's byte-level pre-tokenizer (its splitting regex, no prefix space; Radford et al.
2019) and BPE merges learned from the 256 byte symbols (``initial_alphabet``, so any UTF-8 text
encodes without an unknown token) up to ``--vocab-size`` ids in all, the last one ``<eos>``,
the end-of-document token prepare-data appends. Training is deterministic: the same input and
``tokenizers`` version give the same ``tokenizer.json`` byte for byte (the script prints its SHA-256
and the folder's, the hash the shard index records).
"""

from __future__ import annotations

import argparse
import hashlib
import re
from pathlib import Path

EOS = "<eos>"


def documents(paths: list[str]) -> list[str]:
    """The non-blank lines of the UTF-8 text files, without line endings (prepare-data's ``line`` documents)."""
    out: list[str] = []
    for p in paths:
        out += [x for x in re.split(r"\r?\n", Path(p).read_text(encoding="utf-8")) if x.strip()]
    return out


def train(paths: list[str], vocab_size: int, output: Path) -> None:
    """Train the tokenizer on ``paths`` and save it (``tokenizer.json``, ``tokenizer_config.json``) in ``output``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 1, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(documents(paths), trainer)
    tok.add_special_tokens([EOS])  # id vocab_size - 1
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, model_max_length=int(1e30))
    assert len(fast) == vocab_size and fast.eos_token_id == vocab_size - 1, (len(fast), fast.eos_token_id)
    output.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(output))


def folder_sha256(folder: Path) -> str:
    """The folder hash the shard index records (``workloads.data.prepare.tokenizer_identity``): names and bytes, sorted."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.iterdir() if p.is_file()):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="UTF-8 text files, a document a line")
    ap.add_argument("--vocab-size", type=int, default=2048, help="ids in all: 256 bytes, merges, <eos>")
    ap.add_argument("--output", type=Path, required=True, help="the tokenizer folder (created)")
    a = ap.parse_args()
    train(a.inputs, a.vocab_size, a.output)
    tj = hashlib.sha256((a.output / "tokenizer.json").read_bytes()).hexdigest()
    print(f"tokenizer.json sha256={tj}")
    print(f"folder sha256={folder_sha256(a.output)}")


if __name__ == "__main__":
    main()
