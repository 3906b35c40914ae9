"""The driver's data step: a raw ``data.path`` text file prepared into token shards once per sweep.

Workers never tokenize: a pretraining sweep on ``data.path`` has the driver write ``ROOT/data`` (the
sweep's storage root: the output folder, or a shared folder or URI when ``resources.storage_path``
is set) before the Tune run, and every trial memory-maps it. A resume, or a second start on the same
folder, finds the shards up to date (their checksums) and writes nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sweeps.errors import InvalidInput
from sweeps.spec import SweepSpec

__all__ = ["PREPARED_DIR", "prepared_shards"]

#: the folder under the storage root that holds the sweep's prepared ``data.path``
PREPARED_DIR = "data"

log = logging.getLogger(__name__)


def prepared_shards(spec: SweepSpec, output: Path, storage_root: str) -> str | None:
    """The prepared shards the sweep's workers read, made now if needed.

    Args:
        spec: the resolved spec (absolute paths).
        output: the output folder (the shards are written there first).
        storage_root: the sweep's storage root (``sweeps.store.state.storage_root``): when it is a URI,
            the shards are copied there with ``fsspec`` and the workers fetch them once per node.

    Returns:
        None when the workers read no shards prepared by the driver (fine-tuning, or a spec that
        names ``data.shards`` itself); else the folder or URI of ``ROOT/data``.

    Raises:
        InvalidInput: the text file cannot be prepared (``data.path: ...``).
    """
    if spec.workload != "pretrain" or spec.data.shards is not None or spec.data.path is None:
        return None
    from workloads.api import DataError, prepare_text_file

    local = Path(storage_root) / PREPARED_DIR if "://" not in storage_root else output / PREPARED_DIR
    try:
        result = prepare_text_file(
            spec.data.path, local, tokenizer=spec.data.tokenizer, validation_fraction=spec.data.validation_fraction
        )
    except DataError as exc:
        raise InvalidInput(f"data.path: {exc}") from None
    totals = result.index["totals"]
    log.info(
        "data.path %s %s %s: %d train and %d validation tokens",
        spec.data.path,
        "is up to date in" if result.up_to_date else "prepared into",
        result.folder,
        totals["train"]["tokens"],
        totals["validation"]["tokens"],
    )
    if "://" not in storage_root:
        return result.folder
    import fsspec

    remote = storage_root.rstrip("/") + "/" + PREPARED_DIR
    fs, base = fsspec.core.url_to_fs(remote)
    fs.put(result.folder.rstrip("/") + "/", base, recursive=True)
    return remote
