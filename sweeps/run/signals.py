"""Stopping a sweep by signal: SIGINT (Ctrl-C) and SIGTERM stop it cleanly and resumably; a second
signal force-quits. See :class:`StopSignals`."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

__all__ = ["FORCE_QUIT_DRAIN_S", "StopSignals"]

log = logging.getLogger(__name__)

#: MLflow writes a force-quit still waits for (seconds); a clean stop waits CRITBATCH_MLFLOW_DRAIN_S
FORCE_QUIT_DRAIN_S = 15.0


class StopSignals:
    """SIGINT (Ctrl-C) and SIGTERM (``kill``, ``ray job stop``, Kubernetes) stop a sweep cleanly.

    The first signal asks Tune to end its run (Tune's own interrupt, reached through its SIGUSR1
    handler): Tune snapshots the experiment, in which the running trials stay unfinished, each with
    its last milestone checkpoint, and stops them; the driver then ends every MLflow run
    ``STOPPED``, writes ``sweep.json`` ``STOPPED`` and the CLI exits ``128 + signal`` (130, 143), so
    that ``critbatch resume OUT`` continues the sweep. Ray Tune's own SIGINT handler is turned off
    (``TUNE_DISABLE_SIGINT_HANDLER``): it made ``fit()`` return normally, and an interrupted sweep was
    reported ``SUCCEEDED``. A second signal force-quits (``KeyboardInterrupt`` wherever the driver
    is): no analysis, the runs are still ended ``STOPPED`` (waiting at most
    :data:`FORCE_QUIT_DRAIN_S` for MLflow), and the sweep resumes from Tune's last snapshot (taken
    every ``TUNE_GLOBAL_CHECKPOINT_S``). Later signals are ignored while it quits.

    Handlers are installed in the main thread only (elsewhere Python refuses them), and again by
    :meth:`install` after ``ray.init``, which sets a SIGTERM handler of its own (``sys.exit``).

    Attributes:
        signum: the first signal received, or None.
        forced: a ``KeyboardInterrupt`` was raised (force-quit, or a stop before Tune ran).
        tune_running: set by the driver around ``Tuner.fit()``.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.forced = False
        self.tune_running = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:  # noqa: PYI034 - typing.Self is Python 3.11+; the package runs on 3.10
        return self.install()

    def install(self) -> StopSignals:
        """(Re)install the handlers; the ones found first are restored on exit."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                old = signal.signal(sig, self._on_signal)
                self._old.setdefault(sig, old)
        return self

    def __exit__(self, *exc) -> None:  # never swallows the exception
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._old.clear()

    @property
    def exit_code(self) -> int | None:
        """``128 + signal`` once a signal arrived (the shell's convention: 130 for SIGINT, 143 for SIGTERM)."""
        return None if self.signum is None else 128 + int(self.signum)

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.forced:
            log.warning("%s: already quitting", name)
            return
        if self.signum is not None:
            self.forced = True
            log.warning("%s again: force-quitting; `critbatch resume` continues from Tune's last snapshot", name)
            raise KeyboardInterrupt
        self.signum = signum
        tune_interrupt = signal.getsignal(signal.SIGUSR1)
        if (
            self.tune_running
            and callable(tune_interrupt)
            and getattr(tune_interrupt, "__name__", "") == "signal_interrupt_tune_run"
        ):
            log.warning(
                "%s: stopping the sweep cleanly (trials keep their last checkpoint; `critbatch resume` "
                "continues it); send it again to force-quit",
                name,
            )
            tune_interrupt(signum, frame)  # Tune ends fit() after one last experiment snapshot
            return
        self.forced = True
        log.warning("%s: stopping the sweep", name)
        raise KeyboardInterrupt
