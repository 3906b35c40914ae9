"""Connecting the driver to Ray: a given cluster (``--address``, ``RAY_ADDRESS``) or one started
in-process, with the environment every trial needs; and the resource plan fitted to the cluster's shape."""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass

from sweeps.errors import CritbatchError, InvalidInput
from sweeps.launch.reach import RayUnreachable, probe_ray_address, ray_connect_timeout_s
from sweeps.spec import SweepSpec

__all__ = [
    "HEALTH_CHECK_INTERVAL_S",
    "ResourcePlan",
    "cluster_shape",
    "init_ray",
    "plan_resources",
    "ray_session",
    "trial_env",
]

log = logging.getLogger(__name__)

#: Ray Train's controller polls workers this often; reports block until polled (ray-notes.md).
HEALTH_CHECK_INTERVAL_S = "0.1"
#: How long a reused Tune actor waits for the previous trial's thread to end (Tune's default is 2 s).
#: With ``reuse_actors`` (``sweeps.launch.launcher.reuse_trial_actors``) a finished trial's thread is
#: still tearing down its Ray Train run when the next trial is handed its actor; on a loaded machine
#: that took longer than 2 s, and Tune then aborted the *new* trial ("Could not re-use actor ... reset_config()
#: ... return True"): it was lost without a report (seen once in 12 trials at load average ~20).
REUSE_THREAD_TIMEOUT_S = "300"


#: Prefix of the test suite's fault and hold hooks (``workloads/train/hooks.py``, ``workloads/testing/faults.py``):
#: a driver forwards them to its trials, so they reach trial processes on a cluster the driver did
#: not start (whose processes never see the driver's environment).
TEST_HOOK_PREFIX = "CRITBATCH_TEST_"


def trial_env() -> dict[str, str]:
    """The environment every trial process gets (the driver's own setting of a variable wins for the
    reuse timeout), plus the driver's ``CRITBATCH_TEST_*`` hooks where set."""
    env = {
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": HEALTH_CHECK_INTERVAL_S,
        "TOKENIZERS_PARALLELISM": "false",
        "TUNE_FUNCTION_THREAD_TIMEOUT_S": os.environ.get("TUNE_FUNCTION_THREAD_TIMEOUT_S", REUSE_THREAD_TIMEOUT_S),
    }
    env.update({k: v for k, v in os.environ.items() if k.startswith(TEST_HOOK_PREFIX)})
    return env


@contextlib.contextmanager
def ray_session(address: str | None, spec: SweepSpec, *, connect_timeout_s: float | None = None) -> Iterator[bool]:
    """:func:`init_ray` for the block (yields whether this call connected or started Ray); Ray is shut down
    when the block ends if this call connected or started it, and left alone if it was already up (a
    comparison's arms run inside the comparison's session).

    Raises:
        RayUnreachable: see :func:`init_ray`.
    """
    started = init_ray(address, spec, connect_timeout_s=connect_timeout_s)
    try:
        yield started
    finally:
        if started:
            import ray

            ray.shutdown()


def init_ray(address: str | None, spec: SweepSpec, *, connect_timeout_s: float | None = None) -> bool:
    """Connect to a cluster (``address`` or ``RAY_ADDRESS``) or start one in-process.

    A given address is probed first (:func:`sweeps.launch.reach.probe_ray_address`, within ``connect_timeout_s``
    seconds; default :func:`sweeps.launch.reach.ray_connect_timeout_s`), then connected with one GCS attempt.

    Returns True if this call started Ray (and so must shut it down).

    Raises:
        RayUnreachable: the address did not answer as a Ray cluster, or ``ray.init`` failed to connect
            to it (Ray is left shut down).
        InvalidInput: ``connect_timeout_s`` (or ``CRITBATCH_RAY_CONNECT_TIMEOUT_S``) is not a positive number.
        CritbatchError: Ray did not start in this process (see :data:`LOCAL_START_ATTEMPTS`).
    """
    import ray

    env = trial_env()
    os.environ.update(env)
    # Tune snapshots the experiment (trials, searcher) this often: what a killed driver can lose
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "5")
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    if ray.is_initialized():
        return False
    runtime_env = {"env_vars": env}
    addr = address or os.environ.get("RAY_ADDRESS")
    if addr:
        _connect(addr, runtime_env, ray_connect_timeout_s(connect_timeout_s))
        return True
    # Local: the trials' Tune drivers mostly wait on their Train workers, so one extra logical CPU
    # lets `max_concurrent_trials` workers use every core (ray-notes.md: a trainable needs a
    # non-empty resource request of its own).
    r = spec.resources
    cpus = os.cpu_count() or 1
    extra = (
        1
        if r.trial_driver_cpus * r.max_concurrent_trials <= 1
        else int(-(-r.trial_driver_cpus * r.max_concurrent_trials // 1))
    )
    # one actor process less per trial: a local machine is not preempted by a cloud provider
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    for attempt in range(LOCAL_START_ATTEMPTS):
        try:
            with _quiet_default_token_auth():
                ray.init(
                    address="local",
                    num_cpus=cpus + extra,
                    include_dashboard=True,
                    runtime_env=runtime_env,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                    configure_logging=True,
                )
            return True
        except Exception as exc:
            ray.shutdown()
            if not _transient_start_failure(exc):
                raise
            if attempt == LOCAL_START_ATTEMPTS - 1:
                raise CritbatchError(
                    f"Ray did not start in this process ({LOCAL_START_ATTEMPTS} attempts; the last: "
                    f"{type(exc).__name__}: {str(exc)[:200] or 'no message'}); the machine may be overloaded: "
                    "run the command again, or start a cluster with `ray start --head` and pass "
                    "--address HOST:PORT"
                ) from exc
            log.warning("Ray did not start (%s: %s); retrying", type(exc).__name__, exc)
    return True


def _connect(address: str, runtime_env: dict, timeout_s: float) -> None:
    """Probe ``address`` within ``timeout_s`` seconds, then ``ray.init`` it with one GCS attempt (Ray's default is
    twenty, about five minutes on an address that accepts connections but is no GCS).

    Raises:
        RayUnreachable: the probe failed, or ``ray.init`` did (Ray is shut down again).
    """
    import ray

    probe_ray_address(address, timeout_s)
    unset = "RAY_gcs_server_port_wait_time_s" not in os.environ  # read by ray.init itself (Ray 2.60's node.py)
    if unset:
        os.environ["RAY_gcs_server_port_wait_time_s"] = "1"
    try:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False, logging_level=logging.WARNING)
    except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, TimeoutError of ray.init
        ray.shutdown()
        raise RayUnreachable(
            address,
            f"cannot connect to the Ray cluster at {address}: ray.init failed "
            f"({type(exc).__name__}: {str(exc)[:300] or 'no message'}). Nothing was started. Check "
            "--address (or RAY_ADDRESS): it takes the head's GCS address, HEAD:6379 by default",
        ) from None
    finally:
        if unset:
            os.environ.pop("RAY_gcs_server_port_wait_time_s", None)


class _DropTokenAuthNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


@contextlib.contextmanager
def _quiet_default_token_auth():
    """Drop Ray 2.60's warning that a new local cluster has token authentication on.

    That is Ray's default for a cluster started in this process (the token lands in ~/.ray/auth_token)
    and nothing for a user to act on; a newcomer read the warning as something gone wrong. The
    authentication itself is unchanged (``RAY_AUTH_MODE=disabled`` still opts out, and a disabled
    mode's own warning still shows).
    """
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    notice = _DropTokenAuthNotice()
    logger.addFilter(notice)
    try:
        yield
    finally:
        logger.removeFilter(notice)


#: How often a local Ray start is tried before the driver gives up (``init_ray``).
LOCAL_START_ATTEMPTS = 3


def _transient_start_failure(exc: BaseException) -> bool:
    """Whether a failed in-process ``ray.init`` is worth retrying: Ray's own start-up timeout, or the
    ``EOFError`` / connection errors seen when its dashboard or GCS did not come up on a loaded
    machine (a resume was seen to die twice with a raw ``EOFError``)."""
    return "timed out during startup" in str(exc) or isinstance(exc, (EOFError, ConnectionError))


def cluster_shape() -> tuple[dict[str, float], dict[str, float]]:
    """``(total resources, resources of the node with most CPUs)`` of the connected cluster (alive nodes)."""
    import ray

    total = {k: float(v) for k, v in ray.cluster_resources().items()}
    largest: dict[str, float] = {}
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        res = node.get("Resources", {})
        if res.get("CPU", 0) >= largest.get("CPU", 0):
            largest = {k: float(v) for k, v in res.items()}
    return total, largest


@dataclass(frozen=True)
class ResourcePlan:
    """How many trials run at once, and what one trial takes."""

    bundle_cpus: float
    bundle_gpus: float
    concurrency: int
    warning: str | None = None


def plan_resources(spec: SweepSpec, cluster: dict[str, float], largest_node: dict[str, float]) -> ResourcePlan:
    """Fit the trial bundle (workers x per-worker resources + the trial's Tune driver) to the cluster.

    Args:
        cluster: total resources (``ray.cluster_resources()``).
        largest_node: resources of the biggest node (one worker must fit on one node).

    Returns:
        the plan; concurrency lowered (with a warning) when the requested one does not fit.

    Raises:
        InvalidInput: one worker does not fit on any node, or one whole trial does not fit the
            cluster (the trial would stay PENDING forever).
    """
    r = spec.resources
    w_cpu, w_gpu = r.cpus_per_worker, r.gpus_per_worker
    if w_cpu > largest_node.get("CPU", 0) + 1e-9 or w_gpu > largest_node.get("GPU", 0) + 1e-9:
        raise InvalidInput(
            f"resources: one worker needs {w_cpu:g} CPU and {w_gpu:g} GPU, but the largest node has "
            f"{largest_node.get('CPU', 0):g} CPU and {largest_node.get('GPU', 0):g} GPU"
        )
    cpus = r.workers_per_trial * w_cpu + r.trial_driver_cpus
    gpus = r.workers_per_trial * w_gpu
    tot_cpu, tot_gpu = cluster.get("CPU", 0.0), cluster.get("GPU", 0.0)
    if cpus > tot_cpu + 1e-9 or gpus > tot_gpu + 1e-9:
        raise InvalidInput(
            f"resources: one trial needs {cpus:g} CPU and {gpus:g} GPU "
            f"({r.workers_per_trial} worker(s) x {w_cpu:g} CPU/{w_gpu:g} GPU + {r.trial_driver_cpus:g} CPU for its driver), "
            f"but the cluster has {tot_cpu:g} CPU and {tot_gpu:g} GPU"
        )
    fit = int(math.floor(tot_cpu / cpus + 1e-9))
    if gpus > 0:
        fit = min(fit, int(math.floor(tot_gpu / gpus + 1e-9)))
    conc = min(r.max_concurrent_trials, max(fit, 1))
    warning = None
    if conc < r.max_concurrent_trials:
        warning = (
            f"resources.max_concurrent_trials={r.max_concurrent_trials} does not fit the cluster "
            f"({tot_cpu:g} CPU, {tot_gpu:g} GPU; {cpus:g} CPU and {gpus:g} GPU per trial): running {conc} at a time"
        )
    return ResourcePlan(bundle_cpus=cpus, bundle_gpus=gpus, concurrency=conc, warning=warning)
