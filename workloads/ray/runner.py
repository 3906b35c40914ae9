"""A trial runner: one Ray Train worker group that runs trial after trial (docs/design.md, "Trial runners").

A sweep starts one ``TorchTrainer`` run per concurrent trial slot whose ``train_fn_per_worker`` is
:func:`runner_fn_per_worker`: a loop in which rank 0 takes the next trial from the sweep's trial
exchange (a Ray actor, ``sweeps.launch.exchange.TrialExchange``, reached by name: this package never
imports ``sweeps``), broadcasts it to the group, and every rank runs it exactly as a one-trial worker
group would (:func:`workloads.ray.adapter.run_trial`). The processes, their imports and the
memory-mapped corpus stay warm; the model, optimizer, RNG states, EMA and data order are built from
the trial's own config each time (the workload's ``train`` seeds everything it draws from).

Reports go to the exchange under the trial's ticket (the Tune trainable relays them to Tune), and
checkpoints to the trial's own folder on the sweep's storage (``ckpt-<n>/trial_state.pt`` under the
trial's Ray Train run folder), so a trial restarted in any runner, or by a resumed sweep, continues
from its last milestone. A checkpoint left by a one-trial worker group (Ray Train's
``checkpoint_<time>/trial_state.pt``, a sweep started before runners) is read as well.

Pruning: a trial that Tune stops or pauses is cancelled at the exchange by the driver
(``sweeps.launch.runners.RunnerCancels``); its runner drops it at its next report, or at once while it
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
import pickle
import shutil
import tempfile
import time
import traceback
from typing import Any

import ray
import ray.exceptions
import ray.train
import ray.train.torch
import torch

from workloads.config import from_loop_config
from workloads.errors import CritbatchError
from workloads.ray.adapter import RUNG_WAIT_TIMEOUT_S, STATE_FILE, RungGate, run_trial, worker_nodes
from workloads.train.determinism import make_deterministic
from workloads.train.state_file import out_of_space_error, save_state

__all__ = [
    "IDLE",
    "SHUTDOWN",
    "TrialCancelled",
    "checkpoint_candidates",
    "latest_checkpoint",
    "load_checkpoint",
    "runner_fn_per_worker",
    "save_checkpoint",
]

#: what the exchange's ``take`` returns when the sweep is over
SHUTDOWN = "shutdown"
#: the prefix of a runner checkpoint's folder (``ckpt-000012``: the 12th report of the trial)
_CKPT_PREFIX = "ckpt-"
#: seconds between two asks for work while the exchange has none
_POLL_S = 0.05
#: what rank 0 broadcasts when it has waited this long for work (or at a rung) without an answer: the
#: other ranks wait in a collective meanwhile, whose timeout (``TorchConfig.timeout_s``, 1800 s) must not pass
IDLE = "idle"
_IDLE_SLICE_S = 5.0


class TrialCancelled(CritbatchError):
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
    sees half a checkpoint (a failed write leaves no temporary folder). Returns the checkpoint's folder.

    Raises:
        OutOfSpace: the filesystem is full (or the quota spent): the error names the checkpoint's file
            (:func:`workloads.train.state_file.save_state`), not torch's "unexpected pos".
    """
    fs, base = _filesystem(directory)
    name = f"{_CKPT_PREFIX}{index:06d}"
    target = f"{base}/{name}"
    if "://" not in directory:
        os.makedirs(base, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=base)
        try:
            save_state(state, os.path.join(tmp, STATE_FILE), shown_as=os.path.join(target, STATE_FILE))
            if os.path.exists(target):
                shutil.rmtree(target)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    else:
        import pyarrow.fs as pafs

        with tempfile.TemporaryDirectory() as tmp:
            save_state(state, os.path.join(tmp, STATE_FILE))
            try:
                pafs.copy_files(tmp, target, destination_filesystem=fs)
            except Exception as exc:
                error = out_of_space_error(exc, f"the checkpoint to {directory.rstrip('/')}/{name}", None)
                if error is None:
                    raise
                raise error from exc
    for info in _listing(fs, base):
        n = info.base_name
        if info.type.name == "Directory" and n.startswith(_CKPT_PREFIX) and n < name:
            fs.delete_dir(info.path)
    return target


def _listing(fs, base: str) -> list:
    import pyarrow.fs as pafs

    return fs.get_file_info(pafs.FileSelector(base, allow_not_found=True, recursive=False))


def checkpoint_candidates(directory: str) -> list[str]:
    """The trial's checkpoint files under ``directory``, newest first: a runner's ``ckpt-<n>`` by ``n``, then
    Ray Train's ``checkpoint_<time>`` folders (a trial checkpointed by a one-trial worker group) by time."""
    fs, base = _filesystem(directory)
    infos = [i for i in _listing(fs, base) if i.type.name == "Directory"]
    ours = sorted((i.base_name for i in infos if i.base_name.startswith(_CKPT_PREFIX)), reverse=True)
    theirs = sorted((i.base_name for i in infos if i.base_name.startswith("checkpoint_")), reverse=True)
    return [f"{directory.rstrip('/')}/{n}/{STATE_FILE}" for n in ours + theirs]


def load_checkpoint(path: str) -> dict[str, Any]:
    """The trial state in the file ``path`` (a path or URI).

    Raises:
        OSError, RuntimeError, EOFError, pickle.UnpicklingError: the file is missing or does not load (cut short).
    """
    fs, p = _filesystem(path)
    with fs.open_input_file(p) as handle:
        return torch.load(io.BytesIO(handle.read()), weights_only=False, map_location="cpu")


def latest_checkpoint(directory: str) -> tuple[str | None, dict[str, Any] | None]:
    """``(file, state)`` of the newest checkpoint under ``directory`` that loads, or ``(None, None)``.

    A checkpoint that is missing or does not load (a store without atomic writes, a write cut short) is
    skipped for the one before it, rather than failing the trial or restarting it from scratch.
    """
    for path in checkpoint_candidates(directory):
        try:
            return path, load_checkpoint(path)
        except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError):
            continue
    return None, None


def _broadcast(obj: Any) -> Any:
    """``obj`` from rank 0 on every rank of the group (itself when the group has one worker)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _take(exchange, runner_id: str, slice_s: float) -> Any:
    """Rank 0: the next trial for this runner (``(ticket, config)``), :data:`SHUTDOWN`, or :data:`IDLE` after
    ``slice_s`` seconds without one (the other ranks wait in a collective meanwhile, which must not time out)."""
    deadline = time.monotonic() + slice_s
    while True:
        item = ray.get(exchange.take.remote(runner_id))
        if item is not None:
            return item
        if time.monotonic() >= deadline:
            return IDLE
        time.sleep(_POLL_S)


def _multi_worker() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _fresh_trial_state(device: torch.device) -> None:
    """What one trial may leave in this process that the next must not see: garbage, the CUDA caching
    allocator's blocks, and ``torch.compile``'s caches (whose recompile limit would otherwise make a later
    trial fall back to eager silently)."""
    import gc
    import sys

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()


def runner_fn_per_worker(config: dict[str, Any]) -> None:
    """Ray Train worker entry of a trial runner: run the exchange's trials one after another until it shuts down.

    ``config``: ``exchange`` (the trial exchange actor's name), ``namespace`` (its Ray namespace),
    ``runner_id``. Each taken trial's config is what :func:`workloads.ray.adapter.train_fn_per_worker`
    takes (:func:`workloads.config.loop_config`), its context with ``checkpoint_dir`` set. Returns when the exchange says the sweep is over, or is gone
    (the driver ended it: nothing is left to run).
    """
    try:
        exchange = ray.get_actor(config["exchange"], namespace=config.get("namespace"))
    except ValueError:  # the sweep ended (its exchange is gone) before this group started
        return
    runner_id = str(config["runner_id"])
    rank = ray.train.get_context().get_world_rank()
    device = ray.train.torch.get_device()
    nodes = worker_nodes()
    slice_s = _IDLE_SLICE_S if _multi_worker() else 3600.0
    while True:
        try:
            item = _broadcast(_take(exchange, runner_id, slice_s) if rank == 0 else None)
        except ray.exceptions.RayActorError:  # the exchange is gone: the sweep is over
            item = SHUTDOWN
        if item == SHUTDOWN:
            return
        if item == IDLE:
            continue
        ticket, trial = item
        _fresh_trial_state(device)
        try:
            _run_taken(exchange, ticket, dict(trial), rank=rank, device=device, nodes=nodes)
        except TrialCancelled:
            continue
        except ray.exceptions.RayActorError:
            return  # the exchange is gone mid-trial: the sweep is over
        except Exception:
            if rank == 0 or not _multi_worker():
                ray.get(exchange.failed.remote(runner_id, ticket, traceback.format_exc(limit=20)))
            if _multi_worker() or device.type == "cuda":
                # the other ranks may wait in a collective, and a CUDA error can poison the process:
                # Ray Train restarts the group, and the exchange gives the runner its trial back
                raise
            continue
        if rank == 0:
            ray.get(exchange.finish.remote(ticket))


def _run_taken(exchange, ticket: int, trial: dict[str, Any], *, rank: int, device: torch.device, nodes: str) -> None:
    """Run one taken trial in this worker: its state from its own folder, its reports to the exchange."""
    entered = time.time()
    cfg, context = from_loop_config(trial)
    directory = context.checkpoint_dir
    if directory is None:
        raise ValueError(f"trial {cfg.trial_id}: a trial runner's trial needs its checkpoint_dir (TrialRunContext)")
    settings = make_deterministic(device, context.torch_threads)
    # rank 0 chooses the checkpoint and every rank loads that one: ranks that each listed the folder could
    # pick different states and then disagree on how many reports to replay (a collective mismatch)
    path, resume_state = latest_checkpoint(directory) if rank == 0 else (None, None)
    path = _broadcast(path)
    if rank != 0 and path is not None:
        resume_state = load_checkpoint(path)
    count = [0]
    gate = RungGate(cfg)  # rank 0 waits at a rung (pruning mode pause) until the scheduler lets go or Tune pauses it

    def alive() -> bool:
        return bool(ray.get(exchange.alive.remote(ticket)))

    def publish(clean: dict[str, Any], state: dict[str, Any] | None) -> None:
        keep = True
        if rank == 0:
            count[0] += 1
            if state is not None and alive():  # a cancelled trial writes nothing (another runner may have it)
                save_checkpoint(directory, count[0], state)
            keep = bool(ray.get(exchange.report.remote(ticket, clean)))
        if not _broadcast(keep):
            raise TrialCancelled(str(ticket))
        tokens = gate.reached(clean)
        if tokens is None:
            return
        waited = 0.0
        while True:  # in slices, so that the other ranks' wait in the broadcast never times out
            decision = gate.wait(tokens, cancelled=lambda: not alive(), timeout_s=_IDLE_SLICE_S) if rank == 0 else None
            decision = _broadcast(decision)
            waited += _IDLE_SLICE_S
            if decision == "go":
                return
            if decision == "cancelled":
                raise TrialCancelled(str(ticket))
            if waited >= RUNG_WAIT_TIMEOUT_S:
                import logging

                logging.getLogger(__name__).warning(
                    "no rung decision for %s after %.0f s: going on", gate.key, RUNG_WAIT_TIMEOUT_S
                )
                return

    run_trial(
        cfg,
        context,
        device=device,
        settings=settings,
        rank=rank,
        nodes=nodes,
        entered=entered,
        resume_state=resume_state,
        publish=publish,
    )
