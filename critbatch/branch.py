"""``critbatch branch``: local critical batch size by branched training (Merrill et al. 2025)."""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add the ``branch`` command to the ``critbatch`` app."""

    @app.command()
    def branch(
        spec: Path = typer.Argument(..., help="pretraining sweep spec; its `branch:` section configures the branching"),
        output: Path = typer.Option(
            ..., "--output", "-o", help="folder for branch.json (a sweep's OUT adds local_cbs to its cbs.json)"
        ),
        from_run: str | None = typer.Option(
            None, "--from", help="MLflow run id of a sweep's parent run: branch from its tuned config"
        ),
        tracking_uri: str | None = typer.Option(
            None, "--tracking-uri", help="MLflow tracking URI (overrides the spec)"
        ),
        address: str | None = typer.Option(None, "--address", help="Ray cluster address"),
    ) -> None:
        """Measure the local critical batch size by branching.

        Branches off a base run at batch k*B0 with LR sqrt(k)*lr (Merrill et al. 2025).
        """
        from critbatch.common import EXIT_FAILED, console, out
        from critbatch.common import fail_invalid as _fail_invalid
        from sweeps.errors import InvalidInput
        from sweeps.launch.reach import RayUnreachable
        from sweeps.run.branching import run_branching
        from sweeps.spec import load_spec

        try:
            s = load_spec(spec)
            res = run_branching(s, output, tracking_uri=tracking_uri, from_run_id=from_run, ray_address=address)
        except InvalidInput as exc:  # a SpecError is an InvalidInput
            _fail_invalid(exc)
        except RayUnreachable as exc:  # within CRITBATCH_RAY_CONNECT_TIMEOUT_S: one line, exit 1
            console.print(f"error: {exc}", markup=False, highlight=False)
            raise typer.Exit(EXIT_FAILED)
        for p in res["local_cbs"]:
            out.print(
                f"tokens {p['tokens_seen']:>9}: k* = {p['k_star']}, local CBS = {p['local_cbs_sequences']} sequences",
                highlight=False,
            )
        out.print(f"wrote {output}/branch.json", highlight=False)
