"""``python -m critbatch``: the ``critbatch`` program (Ray job entrypoints call it this way)."""

from critbatch.main import app

app()
