"""``critbatch ui``: the MLflow UI over a sweep's store, opened on the runs table (``make ui``).

The server and the experiment tags it reads are :mod:`sweeps.tracking.ui`'s; this module wires them to the
command line: start, wait, mark the experiment, print the address, serve until Ctrl-C (or SIGTERM).
"""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path
from typing import Any

import typer
from rich.text import Text

from critbatch.common import EXIT_FAILED, console, out
from critbatch.common import fail_invalid as _fail_invalid
from sweeps.errors import InvalidInput
from sweeps.spec.identity import DEFAULT_TRACKING_URI

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add the ``ui`` command to the ``critbatch`` app."""

    @app.command("ui")
    def ui(
        backend_store_uri: str = typer.Option(
            DEFAULT_TRACKING_URI,
            "--backend-store-uri",
            help="the MLflow store to show (`make run` writes sqlite:///mlflow.db); it must exist",
        ),
        port: int = typer.Option(5000, "--port", help="port on 127.0.0.1, 1 to 65535"),
        experiment: str | None = typer.Option(
            None, "--experiment", help="experiment to open (default: the newest sweep's)"
        ),
        start_timeout_s: float = typer.Option(
            180.0, "--start-timeout-s", help="seconds to wait for MLflow to answer (about 45 on an idle 2-core machine)"
        ),
    ) -> None:
        """MLflow UI over a sweep's store, opened on its runs table.

        `mlflow server` on 127.0.0.1 with one worker and MLflow's job runner off. Waits until it answers, marks
        the experiment as model training with critbatch's view of the runs table (batch size, LR, LR rule,
        beta2, seed, val_loss, target_loss, b_crit) where it lacks them, prints the address that opens that
        table (stdout), and serves until Ctrl-C. Exit 2 on a bad option, a missing store or experiment, or a
        port in use; 1 if MLflow does not start.
        """
        from sweeps.tracking.ui import UiConfig

        try:
            if not start_timeout_s > 0:
                raise InvalidInput(f"--start-timeout-s must be positive, got {start_timeout_s:g}")
            config = UiConfig(backend_store_uri=backend_store_uri, port=port)
        except InvalidInput as exc:
            _fail_invalid(exc)
        _serve(config, experiment, start_timeout_s)


def _failed(message: str) -> None:
    """Print ``MLflow UI failed: message`` on stderr and exit 1."""
    console.print(Text.assemble(("MLflow UI failed:", "bold red"), f" {message}"), highlight=False)
    raise typer.Exit(EXIT_FAILED)


def _serve(config: Any, experiment: str | None, start_timeout_s: float) -> None:
    """Start the server, print the address to open, wait for Ctrl-C or SIGTERM (exit 0) or for the server to
    exit on its own (exit 1). The server is stopped on every way out."""
    from sweeps.tracking.ui import UiFailed, start_ui, stop_ui

    log = Path(tempfile.gettempdir()) / f"critbatch-ui-{config.port}.log"
    console.print(
        f"starting the MLflow UI on {config.url} over {config.backend_store_uri} (its log: {log})",
        markup=False,
        highlight=False,
    )
    try:
        server = start_ui(config, log=log, timeout_s=start_timeout_s)
    except InvalidInput as exc:
        _fail_invalid(exc)
    except UiFailed as exc:
        _failed(str(exc))

    def stop_on_sigterm(signum, frame):  # a `kill` of this command stops its server too
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        out.print(_address(server.url, experiment, config.backend_store_uri), markup=False, highlight=False)
        console.print("serving; Ctrl-C stops it", highlight=False)
        code = server.proc.wait()
        _failed(f"mlflow server exited with {code}; see {log}")
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        stop_ui(server)


def _address(ui_url: str, experiment: str | None, store: str) -> str:
    """The address to open: ``experiment``'s (else the newest sweep's) runs table, marked for model training
    with critbatch's view first; the experiments list when the store holds no sweep.

    Raises:
        typer.Exit: 2 when ``experiment`` is not in the store, 1 when the server cannot be read.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from sweeps.tracking.reader import runs_table_url
    from sweeps.tracking.schema import SAVED_VIEW_ID, TAG_SAVED_VIEW_PREFIX
    from sweeps.tracking.ui import mark_experiment, newest_sweep_experiment

    client = MlflowClient(tracking_uri=ui_url)
    try:
        exp = client.get_experiment_by_name(experiment) if experiment else newest_sweep_experiment(client)
    except MlflowException as exc:
        _failed(f"reading the store: {exc}")
    if exp is None and experiment:
        _fail_invalid(InvalidInput(f"no experiment named {experiment!r} in {store}"))
    if exp is None:
        console.print("no critbatch sweep in this store yet: the experiments list", highlight=False)
        return f"{ui_url}/#/experiments?workflowType=machine_learning"
    try:
        marked = mark_experiment(client, exp)
    except MlflowException as exc:  # a store it cannot write: the table opens, without the saved view
        console.print(f"warning: could not tag experiment {exp.name!r}: {exc}", markup=False, highlight=False)
        marked = []
    has_view = bool(marked) or TAG_SAVED_VIEW_PREFIX + SAVED_VIEW_ID in (exp.tags or {})
    console.print(
        f"experiment {exp.name!r}: its runs table, a parent run per sweep with a child run per trial"
        + (f" (tags added: {', '.join(marked)})" if marked else ""),
        markup=False,
        highlight=False,
    )
    return runs_table_url(ui_url, exp.experiment_id, view=has_view)
