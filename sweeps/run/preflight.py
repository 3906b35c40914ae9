"""Checks made before anything starts: data files, output folder, cluster resources.

Each failure is an :class:`~sweeps.errors.InvalidInput` naming what is wrong, so the CLI exits 2
with nothing created (no output folder, no MLflow run, no Ray job).
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from pathlib import Path

from sweeps.errors import InvalidInput
from sweeps.spec import SweepSpec
from sweeps.spec.milestones import milestone_warnings
from sweeps.spec.statuses import SweepStatus

__all__ = [
    "MIN_FIT_BATCH_SIZES",
    "MIN_WARMUP_STEPS",
    "budget_warnings",
    "check_data_files",
    "check_optuna_storage",
    "check_output_folder",
    "check_output_writable",
    "check_tracking_uri",
    "resolve_data_path",
    "resolve_paths",
    "spec_warnings",
    "window_warnings",
]

#: ``critbatch validate`` warns when the LR warmup covers fewer optimizer steps of the largest batch.
MIN_WARMUP_STEPS = 4
#: The fewest batch sizes from which the hyperbola's two parameters and a residual can be fitted
#: (``sweeps.analysis.fit``); ``critbatch validate`` and ``run`` say plainly when a spec has fewer.
MIN_FIT_BATCH_SIZES = 3
#: The fewest batch sizes that can give status ``ok`` (2 on each side of the knee; ``analysis.fit``).
MIN_OK_BATCH_SIZES = 4

log = logging.getLogger(__name__)


def resolve_data_path(spec: SweepSpec) -> str:
    """The spec's data path (``data.path``, else ``data.shards``) made absolute (relative paths resolve
    from the working directory).

    URIs (``s3://``, ``gs://``...) are returned unchanged.
    """
    p = spec.data.path if spec.data.path is not None else spec.data.shards
    assert p is not None  # the spec holds exactly one of data.path and data.shards
    if "://" in p:
        return p
    return str(Path(p).expanduser().resolve())


def check_data_files(spec: SweepSpec) -> dict | None:
    """Check the corpus (and tokenizer, checkpoint) exist and are big enough for the spec.

    Returns:
        the workload's facts about its inputs (``check_inputs``: ``train_tokens`` of a pretraining
        corpus, ``train_rows`` of a fine-tuning set, ...; :func:`window_warnings` reads them), or None
        when the corpus is read only by the workers.

    Raises:
        InvalidInput: a missing file or folder, an empty corpus, or a corpus too short for one
            training window and one validation window of ``context_length_tokens``; first, the
            model (``model.hf_config...``, ``sweeps.launch.workload.check_model``).
    """
    from sweeps.launch.workload import check_model, workload_config
    from workloads.api import get_workload

    check_model(spec)  # model.hf_config...: before the data, whatever the data's form
    if spec.data.shards is not None:
        return _check_shards(spec)
    path = resolve_data_path(spec)
    if "://" in path:
        return None  # read by the workers; checked there
    p = Path(path)
    if not p.is_file():
        raise InvalidInput(f"data.path: file not found: {spec.data.path} (resolved to {path})")
    if p.stat().st_size == 0:
        raise InvalidInput(f"data.path: {spec.data.path} is empty")
    if spec.data.tokenizer != "byte":
        _check_tokenizer(spec.data.tokenizer)
    facts = get_workload(spec.workload).check_inputs(
        workload_config(spec, data_path=path)
    )  # DataError: an InvalidInput
    val_tokens = facts.get("validation_tokens")
    if val_tokens is not None and val_tokens < spec.eval.eval_tokens // 4:
        log.warning(
            "the validation split holds %d tokens, fewer than eval.eval_tokens=%d", val_tokens, spec.eval.eval_tokens
        )
    return facts


def window_warnings(spec: SweepSpec, facts: dict | None) -> list[str]:
    """One sentence when a batch size draws more sequences per optimizer step than the training split holds
    distinct ones: its windows then overlap or repeat within one batch, which carries less than
    its size says (the gradient noise, and so the critical batch size, are measured on fewer distinct data).

    Counted from :func:`check_data_files`' facts, without reading the corpus again: a pretraining split of
    ``train_tokens`` holds ``(train_tokens - 1) // context_length_tokens`` non-overlapping windows (the
    shard index's token counts, or the tokenized text file); a fine-tuning set ``train_rows`` rows (packed
    or padded). Without those facts the sentence says it could not be checked.
    """
    T = spec.model.context_length_tokens
    sizes = sorted(set(spec.search.batch_sizes_sequences))
    facts = facts or {}
    if facts.get("train_rows") is not None:
        n, what = int(facts["train_rows"]), "training rows"
    elif facts.get("train_tokens") is not None:
        n = max(0, (int(facts["train_tokens"]) - 1) // T)
        what = f"non-overlapping training windows of {T} tokens ({int(facts['train_tokens'])} training tokens)"
    else:
        return [
            (
                f"data: the corpus is read by the workers only, so whether one batch of {sizes[-1]} sequences "
                "exceeds its training windows could not be checked"
            )
        ]
    big = [b for b in sizes if b > n]
    if not big:
        return []
    return [
        (
            f"search.batch_sizes_sequences: batch size{'s' if len(big) > 1 else ''} {', '.join(map(str, big))} "
            f"draw{'' if len(big) > 1 else 's'} more sequences per optimizer step than the corpus holds {what} "
            f"({n}): windows overlap or repeat within one batch; use a larger corpus or batch sizes <= {n}"
        )
    ]


def _check_shards(spec: SweepSpec) -> dict:
    """``data.shards``: a pretraining spec whose shard index fits its tokenizer and model.

    Raises:
        InvalidInput: fine-tuning (it reads ``data.path``), or the workload's check failed
            (``data.shards: ...`` / ``data.tokenizer: ...``: a missing or bad index, shards made by
            another tokenizer, a vocabulary larger than the model's, a split shorter than a window).
    """
    from sweeps.launch.workload import workload_config
    from workloads.api import get_workload

    if spec.workload != "pretrain":
        raise InvalidInput(
            "data.shards: only pretraining reads prepared shards; fine-tuning reads data.path (JSON Lines)"
        )
    if spec.data.tokenizer != "byte":
        _check_tokenizer(spec.data.tokenizer)
    shards = resolve_data_path(spec)
    return get_workload(spec.workload).check_inputs(workload_config(spec, shards=shards))  # DataError: an InvalidInput


def _check_tokenizer(tokenizer: str) -> None:
    """A local Hugging Face tokenizer directory that loads.

    Raises:
        InvalidInput: not a folder, a folder without tokenizer files (an empty one gave a
            ``ValueError`` traceback from transformers), or files that do not load.
    """
    from workloads.api import has_tokenizer_files, tokenizer_vocab_size

    if not Path(tokenizer).is_dir():
        raise InvalidInput(f"data.tokenizer: not 'byte' and not a local tokenizer directory: {tokenizer}")
    if not has_tokenizer_files(tokenizer):
        raise InvalidInput(
            f"data.tokenizer: {tokenizer} holds no Hugging Face tokenizer "
            "(no tokenizer.json, tokenizer_config.json, vocab.json or tokenizer model)"
        )
    try:
        tokenizer_vocab_size(tokenizer)
    except Exception as exc:  # noqa: BLE001 - transformers raises anything from ValueError to OSError
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InvalidInput(f"data.tokenizer: the tokenizer in {tokenizer} does not load: {first}") from None


def check_tracking_uri(uri: str, *, source: str) -> None:
    """Refuse a tracking URI that MLflow would refuse only once the sweep has started.

    Args:
        uri: the resolved tracking URI (:func:`sweeps.spec.identity.local_tracking_uri`).
        source: where it came from, named in the error (``--tracking-uri``, ``tracking.uri``,
            ``MLFLOW_TRACKING_URI`` or the default).

    Raises:
        InvalidInput: a file store (``file://`` or a bare folder) without MLflow's opt-in
            ``MLFLOW_ALLOW_FILE_STORE=true`` (MLflow 3 refuses it with an ``MlflowException``), or a
            ``sqlite:///`` database whose folder does not exist.
    """
    file_store = uri.startswith("file:") or "://" not in uri
    if file_store and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").strip().lower() not in ("true", "1"):
        raise InvalidInput(
            f"{source} {uri!r}: MLflow's file store is refused unless MLFLOW_ALLOW_FILE_STORE=true; "
            "use sqlite:///PATH/mlflow.db or an MLflow server"
        )
    if uri.startswith("sqlite:///") and len(uri) > len("sqlite:///"):
        db = Path(uri[len("sqlite:///") :].split("?", 1)[0])
        if not db.parent.is_dir():
            raise InvalidInput(f"{source} {uri!r}: the folder {db.parent} does not exist")


#: How long :func:`check_optuna_storage` waits for another process's lock on a SQLite study storage.
OPTUNA_LOCK_WAIT_S = 5.0


def check_optuna_storage(url: str, *, source: str, wait_s: float = OPTUNA_LOCK_WAIT_S) -> None:
    """Refuse an Optuna SQLite storage that another process holds locked, before anything starts.

    Without this check the sweep failed ~50 s in (Ray connected, data prepared, an MLflow parent
    run created) with a SQLAlchemy traceback. Only ``sqlite:///`` storages are checked:
    a write transaction is opened (``BEGIN IMMEDIATE``, waiting up to ``wait_s`` seconds for a lock)
    and rolled back, so nothing is written; a file that does not exist yet is created by Optuna
    later and is not checked. Other databases (PostgreSQL, MySQL) are left to Optuna.

    Args:
        url: the study storage URL (``sqlite:///OUT/optuna.db`` or ``CRITBATCH_OPTUNA_STORAGE``).
        source: what named it, for the message.

    Raises:
        InvalidInput: the database is locked (or cannot be opened for writing), naming the file.
    """
    import sqlite3

    if not url.startswith("sqlite:///") or len(url) <= len("sqlite:///"):
        return
    db = Path(url[len("sqlite:///") :].split("?", 1)[0])
    if not db.is_file():
        return
    try:
        conn = sqlite3.connect(str(db), timeout=wait_s)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.rollback()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise InvalidInput(
            f"{source}: the Optuna study storage {db} cannot be written ({exc}; waited {wait_s:g} s): another "
            "process holds it; stop that process or use another storage"
        ) from exc


def spec_warnings(spec: SweepSpec) -> list[str]:
    """Valid but doubtful choices in a spec, one sentence each (``critbatch validate`` prints them).

    The LR warmup, ``max(warmup_tokens, warmup_min_steps * B * T)`` tokens, should cover at least
    :data:`MIN_WARMUP_STEPS` optimizer steps of the largest batch (Goyal et al. 2017, gradual warmup):
    with fewer, the largest batch sizes start at nearly full LR. With ``batch_warmup`` the ramp runs
    at the largest trial's first (smallest) batch.
    """
    from workloads.api import warmup_length_tokens

    out: list[str] = []
    b = max(spec.search.batch_sizes_sequences)
    if spec.batch_warmup is not None:
        sched = spec.batch_warmup.schedule
        b = max(1, b * sched[0][1] // sched[-1][1])
    step_tokens = b * spec.model.context_length_tokens
    sch = spec.schedule
    warm = warmup_length_tokens(sch.warmup_tokens, sch.warmup_min_steps, step_tokens)
    if warm < MIN_WARMUP_STEPS * step_tokens:
        out.append(
            f"schedule: the LR warmup ({warm} tokens) covers {warm / step_tokens:.3g} optimizer step(s) of the largest "
            f"batch ({b} sequences x {spec.model.context_length_tokens} tokens), fewer than {MIN_WARMUP_STEPS}; set "
            f"schedule.warmup_min_steps >= {MIN_WARMUP_STEPS} (or warmup_tokens >= {MIN_WARMUP_STEPS * step_tokens})"
        )
    n_b = len(set(spec.search.batch_sizes_sequences))
    if n_b < MIN_FIT_BATCH_SIZES:
        out.append(
            f"search.batch_sizes_sequences: {n_b} batch size{'s' if n_b > 1 else ''} cannot give b_crit (the fit of "
            f"S = S_min + E_min/B needs at least {MIN_FIT_BATCH_SIZES}): this sweep reports each batch size's losses "
            f"and steps to target, and no b_crit"
        )
    elif n_b < MIN_OK_BATCH_SIZES:
        out.append(
            f"search.batch_sizes_sequences: {n_b} batch sizes can give b_crit but never status ok, which needs at "
            f"least 2 fitted batch sizes on each side of the knee ({MIN_OK_BATCH_SIZES} or more, all reaching the "
            f"target): the answer will be edge at best"
        )
    out += milestone_warnings(spec) + budget_warnings(spec)
    return out


def budget_warnings(spec: SweepSpec) -> list[str]:
    """One sentence naming the batch sizes whose step (``B x context_length_tokens``) does not divide
    ``budget_tokens``: the loop stops after the first step at or past the budget, so they train (and
    report their last point) up to one step past it, more tokens than the others (so the
    equal-compute comparison is off by that much). Fine-tuning steps count real tokens and are not judged."""
    if spec.workload != "pretrain":
        return []
    T = spec.model.context_length_tokens
    over = {b: -(-spec.budget_tokens // (b * T)) * b * T for b in sorted(set(spec.search.batch_sizes_sequences))}
    over = {b: t for b, t in over.items() if t != spec.budget_tokens}
    if not over:
        return []
    return [
        "budget_tokens: "
        + ", ".join(
            f"batch size {b} trains {t} tokens ({t / spec.budget_tokens - 1:.1%} more)" for b, t in over.items()
        )
        + f", not {spec.budget_tokens}: their steps ({T} x B tokens) do not divide it; use a multiple of "
        f"{math.lcm(*(b * T for b in spec.search.batch_sizes_sequences))} tokens for equal compute"
    ]


def check_output_writable(output: Path, *, purpose: str = "resume") -> None:
    """Refuse an output folder this process cannot write in (``chmod a-w``, another user's folder, a read-only
    mount): ``critbatch resume`` writes the sweep's state, records and report there, and without this check
    failed on its lock file with a traceback once Ray was up.

    The test is an actual write (a temporary file, created and removed at once), not the permission bits,
    which say nothing of a read-only filesystem and do not bind root.

    Raises:
        InvalidInput: one line naming the folder and the reason.
    """
    try:
        fd, probe = tempfile.mkstemp(prefix=".critbatch-write-check-", dir=output)
    except OSError as exc:
        raise InvalidInput(
            f"cannot {purpose}: output folder {output} is not writable ({exc.strerror or exc}); "
            f"critbatch {purpose} writes the sweep's state there: make it writable"
        ) from None
    os.close(fd)
    os.unlink(probe)


def resolve_paths(spec: SweepSpec) -> SweepSpec:
    """The spec with its local paths made absolute (workers run in another working directory)."""
    where = "path" if spec.data.path is not None else "shards"
    update: dict = {"data": spec.data.model_copy(update={where: resolve_data_path(spec)})}
    if spec.data.tokenizer != "byte" and "://" not in spec.data.tokenizer:
        update["data"] = update["data"].model_copy(
            update={"tokenizer": str(Path(spec.data.tokenizer).expanduser().resolve())}
        )
    if spec.finetune is not None and "://" not in spec.finetune.checkpoint_dir:
        update["finetune"] = spec.finetune.model_copy(
            update={"checkpoint_dir": str(Path(spec.finetune.checkpoint_dir).expanduser().resolve())}
        )
    if isinstance(spec.model.hf_config, str):  # read once, here: the workers get the mapping, not a path
        from sweeps.spec.hf_config import read_hf_config

        update["model"] = spec.model.model_copy(update={"hf_config": read_hf_config(spec.model.hf_config)})
    return spec.model_copy(update=update)


def check_output_folder(output: Path, *, resuming: bool = False) -> None:
    """Refuse an output folder that holds another sweep (unless resuming it), or that cannot be created.

    A quick look, not the claim (:func:`claim_output_folder` makes it atomic), before Ray is reached.

    Raises:
        InvalidInput: ``OUT/sweep.json`` exists and we are not resuming, or is missing when resuming; ``OUT``
            is not a folder, or its nearest existing parent is not a folder this process may write in.
    """
    marker = output / "sweep.json"
    if resuming:
        if not marker.is_file():
            raise InvalidInput(f"{output} holds no sweep to resume (no sweep.json)")
        return
    if output.exists() and not output.is_dir():
        raise InvalidInput(f"--output {output} exists and is not a folder")
    parent = next((p for p in output.parents if p.exists()), None) if not output.exists() else None
    if parent is not None and not (parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)):
        why = "is not a folder" if not parent.is_dir() else "is not writable"
        raise InvalidInput(f"--output {output}: cannot create the folder: {parent} {why}")
    if marker.is_file():
        try:
            held = json.loads(marker.read_text())
        except (OSError, ValueError):
            held = {}
        if held.get("status") == SweepStatus.STARTING:
            return  # a claim, live or abandoned: claim_output_folder tells which
        other = held.get("sweep_id", "?")
        raise InvalidInput(
            f"--output {output} already holds sweep '{other}': use `critbatch resume {output}` to continue it, "
            "or choose another folder"
        )
