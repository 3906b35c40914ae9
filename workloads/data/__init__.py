"""Corpora and token shards: what a workload trains on.

``corpus`` loads a corpus (prepared shards or one text file) and draws the deterministic batch
stream; ``shards`` reads and writes the token-shard format; ``prepare`` (with ``_prepare_io``)
tokenizes raw inputs into shards; ``tokenizer`` holds the byte-level tokenizer and the checks on a
tokenizer folder.

Where it stands: imports ``workloads.errors`` only (no model, no training loop); checked by
``tests/test_layering.py``. Kept light: nothing is imported here (``workloads.api`` imports
``tokenizer`` without torch).
"""
