"""The front door of ``sweeps/run``: run or resume a sweep, one sweep or a comparison of arms.

The CLI (``critbatch run`` / ``resume``, which the service's Ray jobs run too) and library users call
:func:`run_sweep` and :func:`resume_sweep`. A spec with ``arms``, or an output folder that holds a
comparison, goes to :mod:`sweeps.run.compare`, which runs each arm through :mod:`sweeps.run.driver`;
anything else goes to the driver directly. The arrows run ``api -> compare -> driver`` and never back;
both prepare each sweep once with :func:`prepare_sweep` (:mod:`sweeps.run.prepare`), and both return a
:class:`SweepResult` (:mod:`sweeps.run.context`).
"""

from __future__ import annotations

from pathlib import Path

from sweeps.run.context import PreparedSweep, SweepResult
from sweeps.run.prepare import prepare_sweep
from sweeps.settings import Settings
from sweeps.spec import SweepSpec

__all__ = ["PreparedSweep", "SweepResult", "prepare_sweep", "resume_sweep", "run_sweep"]


def run_sweep(
    spec: SweepSpec,
    output: Path,
    *,
    tracking_uri: str | None = None,
    sweep_id: str | None = None,
    ray_address: str | None = None,
    ray_connect_timeout_s: float | None = None,
    show_progress: bool = True,
    settings: Settings | None = None,
) -> SweepResult:
    """Run the sweep of ``spec`` into ``output`` (:func:`sweeps.run.driver.run_single_sweep`), or the
    comparison of its ``arms`` (:func:`sweeps.run.compare.run_comparison`). ``settings``: the ``CRITBATCH_*``
    settings (:class:`sweeps.settings.Settings`), built once by the caller; default: from the environment.

    ``ray_address`` (else ``RAY_ADDRESS``; neither: Ray starts in this process) must answer within
    ``ray_connect_timeout_s`` seconds (default ``CRITBATCH_RAY_CONNECT_TIMEOUT_S``, else 30:
    :func:`sweeps.launch.reach.ray_connect_timeout_s`).

    Returns:
        the :class:`SweepResult` (``ok``, ``status``, ``sweep_id``, ``cbs``, ``output``, ``message``,
        ``exit_code``; :meth:`SweepResult.to_dict` for JSON): ``ok`` is False when the sweep FAILED or was
        STOPPED; ``exit_code`` is ``128 + signal`` when a signal stopped it, else None.

    Raises:
        InvalidInput: bad input of any kind (see the two functions above); nothing was created.
        RayUnreachable: the Ray address did not answer in time (:mod:`sweeps.launch.reach`); nothing was created.
        CritbatchError: MLflow unreachable when the sweep starts (nothing is left behind either).
    """
    if spec.arms:
        from sweeps.run.compare import run_comparison

        return run_comparison(
            spec,
            output,
            tracking_uri=tracking_uri,
            sweep_id=sweep_id,
            ray_address=ray_address,
            ray_connect_timeout_s=ray_connect_timeout_s,
            show_progress=show_progress,
            settings=settings,
        )
    from sweeps.run.driver import run_single_sweep

    return run_single_sweep(
        spec,
        output,
        tracking_uri=tracking_uri,
        sweep_id=sweep_id,
        ray_address=ray_address,
        ray_connect_timeout_s=ray_connect_timeout_s,
        show_progress=show_progress,
        settings=settings,
    )


def resume_sweep(
    output: Path,
    *,
    ray_address: str | None = None,
    ray_connect_timeout_s: float | None = None,
    show_progress: bool = True,
    settings: Settings | None = None,
) -> SweepResult:
    """Continue the sweep (:func:`sweeps.run.driver.resume_single_sweep`) or the comparison
    (:func:`sweeps.run.compare.resume_comparison`) in ``output``; returns what :func:`run_sweep` returns.
    ``settings``: as for :func:`run_sweep`.

    Raises:
        InvalidInput: ``output`` holds nothing to resume, or what it holds cannot be resumed (the message says why).
        RayUnreachable: the Ray address did not answer within ``ray_connect_timeout_s`` seconds; nothing changed.
    """
    from sweeps.run.compare import is_comparison, resume_comparison

    output = Path(output).expanduser().resolve()
    if is_comparison(output):
        return resume_comparison(
            output,
            ray_address=ray_address,
            ray_connect_timeout_s=ray_connect_timeout_s,
            show_progress=show_progress,
            settings=settings,
        )
    from sweeps.run.driver import resume_single_sweep

    return resume_single_sweep(
        output,
        ray_address=ray_address,
        ray_connect_timeout_s=ray_connect_timeout_s,
        show_progress=show_progress,
        settings=settings,
    )
