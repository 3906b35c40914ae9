"""``python -m sweeps.cli``: the ``critbatch`` program (Ray job entrypoints call it this way)."""

from sweeps.cli.main import app

app()
