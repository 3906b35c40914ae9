"""A trial runner: one Ray Train worker group that runs trial after trial (docs/design.md, "Trial runners").

A sweep starts one ``TorchTrainer`` run per concurrent trial slot whose ``train_fn_per_worker`` is
:func:`runner_fn_per_worker`: a loop in which rank 0 takes the next trial from the sweep's trial
exchange (a Ray actor, ``sweeps.run.runners.TrialExchange``, reached by name: this package never
imports ``sweeps``), broadcasts it to the group, and every rank runs it exactly as a one-trial worker
group would (:func:`workloads._ray_adapter.run_trial`). The processes, their imports and the
memory-mapped corpus stay warm; the model, optimizer, RNG states, EMA and data order are built from
the trial's own config each time (the workload's ``train`` seeds everything it draws from).

Reports go to the exchange under the trial's ticket (the Tune trainable relays them to Tune), and
checkpoints to the trial's own folder on the sweep's storage (``ckpt-<n>/trial_state.pt`` under the
trial's Ray Train run folder), so a trial restarted in any runner, or by a resumed sweep, continues
from its last milestone. A checkpoint left by a one-trial worker group (Ray Train's
``checkpoint_<time>/trial_state.pt``, a sweep started before runners) is read as well.

Pruning: a trial that Tune stops or pauses is cancelled at the exchange by the driver
(``sweeps.run.runners.RunnerCancels``); its runner drops it at its next report, or at once while it
waits at a rung of pruning mode ``pause`` (only rank 0 waits there; the others wait for its word).
A paused trial resumed later continues from its checkpoint in whichever runner takes it.

Faults: a trial that raises in a one-worker group is handed back to the exchange (which retries it up
to the trial's ``max_failures``, or ends it with the error) and the runner takes the next; in a larger
group the error ends the group's attempt, Ray Train restarts the group, and the exchange gives the
runner its trial in flight again (counting the failure against that trial).
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import time
import traceback
from typing import Any

import torch

import ray
import ray.train
import ray.train.torch

from workloads._ray_adapter import STATE_FILE, RungGate, run_trial, worker_nodes
from workloads.config import CHECKPOINT_DIR_KEY, TORCH_THREADS_KEY, TRIAL_STARTED_KEY, TrialConfig
from workloads.determinism import make_deterministic

__all__ = ["runner_fn_per_worker", "SHUTDOWN", "TrialCancelled",
           "latest_checkpoint", "save_checkpoint"]

#: what the exchange's ``take`` returns when the sweep is over
SHUTDOWN = "shutdown"
#: the prefix of a runner checkpoint's folder (``ckpt-000012``: the 12th report of the trial)
_CKPT_PREFIX = "ckpt-"
#: seconds between two asks for work while the exchange has none
_POLL_S = 0.05


class TrialCancelled(Exception):
    """The exchange no longer wants this trial (its Tune trial ended, or the sweep did): stop it at once."""


def _filesystem(uri: str):
    """``(pyarrow filesystem, path)`` for a local folder or a URI (``s3://``, ``gs://``, ...)."""
    import pyarrow.fs as pafs

    if "://" in uri:
        return pafs.FileSystem.from_uri(uri)
    return pafs.LocalFileSystem(), os.path.abspath(uri)


def save_checkpoint(directory: str, index: int, state: dict[str, Any]) -> str:
    """Write ``state`` as ``<directory>/ckpt-<index>/trial_state.pt`` and delete the older runner checkpoints.

    Written under a temporary name and renamed (local) or copied whole (remote), so a reader never
    sees half a checkpoint. Returns the checkpoint's folder.
    """
    fs, base = _filesystem(directory)
    name = f"{_CKPT_PREFIX}{index:06d}"
    target = f"{base}/{name}"
    if "://" not in directory:
        os.makedirs(base, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=base)
        torch.save(state, os.path.join(tmp, STATE_FILE))
        if os.path.exists(target):
            shutil.rmtree(target)
        os.replace(tmp, target)
    else:
        import pyarrow.fs as pafs

        with tempfile.TemporaryDirectory() as tmp:
            torch.save(state, os.path.join(tmp, STATE_FILE))
            pafs.copy_files(tmp, target, destination_filesystem=fs)
    for info in _listing(fs, base):
        n = info.base_name
        if info.type.name == "Directory" and n.startswith(_CKPT_PREFIX) and n < name:
            fs.delete_dir(info.path)
    return target


def _listing(fs, base: str) -> list:
    import pyarrow.fs as pafs

    return fs.get_file_info(pafs.FileSelector(base, allow_not_found=True, recursive=False))


def latest_checkpoint(directory: str) -> dict[str, Any] | None:
    """The trial state saved last under ``directory``, or None (a trial that never reported a checkpoint).

    A runner's ``ckpt-<n>`` with the largest ``n`` first; else the newest of Ray Train's
    ``checkpoint_*`` folders (a trial checkpointed by a one-trial worker group).
    """
    fs, base = _filesystem(directory)
    infos = [i for i in _listing(fs, base) if i.type.name == "Directory"]
    ours = sorted(i.path for i in infos if i.base_name.startswith(_CKPT_PREFIX))
    candidates = [ours[-1]] if ours else []
    if not candidates:
        theirs = [i for i in infos if i.base_name.startswith("checkpoint_")]
        candidates = [i.path for i in sorted(theirs, key=lambda i: i.base_name, reverse=True)]
    for path in candidates:
        f = f"{path}/{STATE_FILE}"
        if fs.get_file_info(f).type.name != "File":
            continue
        with fs.open_input_file(f) as handle:
            return torch.load(io.BytesIO(handle.read()), weights_only=False, map_location="cpu")
    return None


def _broadcast(obj: Any) -> Any:
    """``obj`` from rank 0 on every rank of the group (itself when the group has one worker)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _take(exchange, runner_id: str) -> Any:
    """Rank 0: the next trial for this runner (``(ticket, config)``) or :data:`SHUTDOWN`, waiting for one."""
    while True:
        item = ray.get(exchange.take.remote(runner_id))
        if item is not None:
            return item
        time.sleep(_POLL_S)


def runner_fn_per_worker(config: dict[str, Any]) -> None:
    """Ray Train worker entry of a trial runner: run the exchange's trials one after another until it shuts down.

    ``config``: ``exchange`` (the trial exchange actor's name), ``namespace`` (its Ray namespace),
    ``runner_id``. Each taken trial's config is what :func:`workloads._ray_adapter.train_fn_per_worker`
    takes, plus :data:`CHECKPOINT_DIR_KEY`.
    """
    exchange = ray.get_actor(config["exchange"], namespace=config.get("namespace"))
    runner_id = str(config["runner_id"])
    rank = ray.train.get_context().get_world_rank()
    device = ray.train.torch.get_device()
    nodes = worker_nodes()
    while True:
        item = _broadcast(_take(exchange, runner_id) if rank == 0 else None)
        if item == SHUTDOWN:
            return
        ticket, trial = item
        try:
            _run_taken(exchange, ticket, dict(trial), rank=rank, device=device, nodes=nodes)
        except TrialCancelled:
            continue
        except Exception:  # noqa: BLE001 - the trial's error, not the runner's: hand it back
            if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
                raise  # the other ranks may wait in a collective: Ray Train restarts the group
            ray.get(exchange.failed.remote(runner_id, ticket, traceback.format_exc(limit=20)))
            continue
        if rank == 0:
            ray.get(exchange.finish.remote(ticket))


def _run_taken(exchange, ticket: int, trial: dict[str, Any], *, rank: int, device: torch.device, nodes: str) -> None:
    """Run one taken trial in this worker: its state from its own folder, its reports to the exchange."""
    entered = time.time()
    directory = trial.pop(CHECKPOINT_DIR_KEY)
    save_dir = trial.pop("_save_dir", None)
    started = trial.pop(TRIAL_STARTED_KEY, None)
    threads = trial.pop(TORCH_THREADS_KEY, None)
    cfg = TrialConfig.from_dict(trial)
    settings = make_deterministic(device, threads)
    resume_state = latest_checkpoint(directory)
    count = [0]
    gate = RungGate(cfg)  # rank 0 waits at a rung (pruning mode pause) until the scheduler lets go or Tune pauses it

    def cancelled() -> bool:
        return not ray.get(exchange.alive.remote(ticket))

    def publish(clean: dict[str, Any], state: dict[str, Any] | None) -> None:
        keep = True
        if rank == 0:
            count[0] += 1
            if state is not None:
                save_checkpoint(directory, count[0], state)
            keep = bool(ray.get(exchange.report.remote(ticket, clean))) and gate.after(clean, cancelled=cancelled)
        if not _broadcast(keep):
            raise TrialCancelled(str(ticket))

    run_trial(cfg, device=device, settings=settings, rank=rank, nodes=nodes, started=started, entered=entered,
              resume_state=resume_state, save_dir=save_dir, publish=publish)
