"""``critbatch plan``: from a finished sweep's fits to devices, bandwidth and hours (:mod:`sweeps.analysis.plan`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

__all__ = ["register"]


def _cluster(cluster_file: Path | None, overrides: dict):
    """The :class:`ClusterSpec` from ``--cluster`` (YAML) with the given command-line options over it.

    Raises:
        InvalidInput: unreadable YAML, or invalid/unknown/missing fields (each named).
    """
    import pydantic
    import yaml

    from sweeps.analysis.plan import ClusterSpec
    from sweeps.errors import InvalidInput

    data: dict = {}
    if cluster_file is not None:
        try:
            data = yaml.safe_load(cluster_file.read_text(encoding="utf-8")) or {}
        except FileNotFoundError:
            raise InvalidInput(f"--cluster: file not found: {cluster_file}") from None
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise InvalidInput(f"--cluster: cannot read {cluster_file} as YAML: {exc}") from None
        if not isinstance(data, dict):
            raise InvalidInput(f"--cluster: {cluster_file} must be a mapping of cluster fields")
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return ClusterSpec(**data)
    except pydantic.ValidationError as exc:
        errs = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or 'cluster'}: {e['msg']}" for e in exc.errors())
        raise InvalidInput(
            f"invalid cluster ({len(exc.errors())} error(s)): {errs} (the command-line options "
            "--devices, --peak-flops, --bandwidth or the --cluster YAML fields devices, "
            "peak_flops_per_s, bandwidth_bytes_per_s, ...)"
        ) from None


def _numbers(text: str, name: str) -> list[float]:
    """Comma-separated positive numbers. Raises InvalidInput naming the option ``name``."""
    from sweeps.errors import InvalidInput

    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InvalidInput(f"{name} must be comma-separated numbers, got {text!r}") from None
    if not vals or any(not v > 0 for v in vals):
        raise InvalidInput(f"{name} must be positive numbers, got {text!r}")
    return vals


def _swept(text: str) -> tuple[float, float]:
    """``--swept-range LO,HI`` (sequences). Raises InvalidInput."""
    from sweeps.errors import InvalidInput

    lo_hi = _numbers(text, "--swept-range")
    if len(lo_hi) != 2 or lo_hi[0] > lo_hi[1]:
        raise InvalidInput(f"--swept-range must be LO,HI with LO <= HI, got {text!r}")
    return lo_hi[0], lo_hi[1]


def _report(out_dir: Path) -> Path | None:
    """Re-render ``OUT/report.html`` (now with the plan section); None, with a warning, if the folder
    lacks what it needs (the plan stands without the report)."""
    from sweeps.analysis.report import write_report
    from sweeps.analysis.targets import TrialRecord
    from sweeps.spec import load_stored_spec

    if not (out_dir / "trials.json").is_file():  # not a sweep's folder (a cbs.json alone): no report to update
        return None
    try:
        analysis = json.loads((out_dir / "cbs.json").read_text(encoding="utf-8"))
        rows = json.loads((out_dir / "trials.json").read_text(encoding="utf-8"))
        spec = load_stored_spec(out_dir / "spec.yaml")
        records = [TrialRecord.from_dict(r) for r in rows]
        return write_report(out_dir, analysis, records, spec)
    except Exception as exc:  # noqa: BLE001 - an older or partial folder: the plan stands without the report
        from critbatch.common import console

        console.print(f"warning: report.html not updated ({type(exc).__name__}: {exc})", markup=False, highlight=False)
        return None


def _inputs(
    source: Path,
    flops_per_token: float | None,
    params: float | None,
    tokens_per_sequence: float | None,
    swept: tuple[float, float] | None,
) -> dict:
    """What the plan is made from: a study's ``scale.json`` (its prediction at a production budget), else a sweep's
    fits (:func:`sweeps.analysis.plan_files.load_plan_inputs`). Raises InvalidInput."""
    from sweeps.analysis.plan_files import load_plan_inputs
    from sweeps.scaling.plan import is_scale_result, plan_inputs_from_scale

    if is_scale_result(source):
        return plan_inputs_from_scale(
            source, flops_per_token=flops_per_token, params=params, tokens_per_sequence=tokens_per_sequence
        )
    return load_plan_inputs(
        source, flops_per_token=flops_per_token, params=params, tokens_per_sequence=tokens_per_sequence, swept=swept
    )


def register(app: typer.Typer) -> None:
    """Add the ``plan`` command to the ``critbatch`` app."""

    @app.command("plan")
    def plan(
        source: Path = typer.Argument(
            ...,
            help="a finished sweep's folder (OUT), its cbs.json, the JSON of "
            "critbatch analyze --csv, or a study's scale.json (with a prediction)",
        ),
        cluster: Path | None = typer.Option(
            None, "--cluster", help="cluster YAML (fields of ClusterSpec; the options below override it)"
        ),
        devices: int | None = typer.Option(None, "--devices", help="the most devices (data-parallel workers)"),
        peak_flops: float | None = typer.Option(None, "--peak-flops", help="peak FLOP/s per device"),
        mfu: float | None = typer.Option(None, "--mfu", help="model-FLOPs utilisation in (0, 1] (default 0.4)"),
        bandwidth: float | None = typer.Option(None, "--bandwidth", help="all-reduce bandwidth per device, bytes/s"),
        latency: float | None = typer.Option(None, "--latency", help="per-message latency, seconds (default 5e-6)"),
        device_hours_cap: float | None = typer.Option(None, "--device-hours-cap", help="the most device-hours"),
        micro_batch: int | None = typer.Option(
            None,
            "--micro-batch-max",
            help="most sequences per device per forward/backward (rows then give accumulation steps)",
        ),
        overlap: bool | None = typer.Option(
            None,
            "--overlap/--no-overlap",
            help="overlap all-reduce and compute (step = max instead of sum; default no overlap)",
        ),
        sync_every_steps: int | None = typer.Option(
            None,
            "--sync-every-steps",
            min=1,
            help="local SGD / DiLoCo: "
            "all-reduce every H steps (default: the spec's "
            "resources.sync.every_steps, else 1)",
        ),
        flops_per_token: float | None = typer.Option(
            None, "--flops-per-token", help="training FLOPs per token (default: cbs.json's)"
        ),
        params: float | None = typer.Option(
            None,
            "--params",
            help="parameters whose gradients are all-reduced (default: cbs.json n_params, else flops_per_token/6)",
        ),
        tokens_per_sequence: float | None = typer.Option(
            None, "--tokens-per-sequence", help="tokens per sequence (default: cbs.json's)"
        ),
        grad_bytes: float = typer.Option(
            4.0, "--grad-bytes-per-param", help="bytes per gradient element (4 fp32, 2 bf16)"
        ),
        batch_sizes: str | None = typer.Option(
            None,
            "--batch-sizes",
            help="comma-separated global batch sizes (sequences); default: powers of 2 over and beyond the swept range",
        ),
        swept_range: str | None = typer.Option(
            None,
            "--swept-range",
            help="LO,HI: the swept batch sizes (sequences), to flag extrapolation of an analyze --csv fit",
        ),
        output: Path | None = typer.Option(
            None,
            "--output",
            "-o",
            help="folder for plan.json and plots/plan.png (default: the sweep folder when SOURCE is one)",
        ),
        as_json: bool = typer.Option(
            False,
            "--json",
            help="also print the plan as JSON to stdout (the default only when no plan.json is written)",
        ),
    ) -> None:
        """Plan a data-parallel run from a sweep's fits.

        Time to target, device-hours and the device count past which time stops falling, for every
        (global batch, devices) pair. A one-line summary goes to stderr; the plan to plan.json (with a
        plot, and a section added to the sweep's report.html, rewritten in place), or as JSON to stdout
        when no folder is written or with --json.
        """
        from critbatch.common import console
        from critbatch.common import fail_invalid as _fail_invalid
        from sweeps.analysis import finite_json
        from sweeps.analysis.plan_files import make_plan, plan_summary, write_plan
        from sweeps.errors import InvalidInput, WriteFailed

        try:
            if output is not None and output.exists() and not output.is_dir():
                raise InvalidInput(f"--output {output} is a file: give a folder for plan.json and plots/plan.png")
            swept = _swept(swept_range) if swept_range else None
            grid = [int(b) for b in _numbers(batch_sizes, "--batch-sizes")] if batch_sizes else None
            if grad_bytes <= 0:
                raise InvalidInput(f"--grad-bytes-per-param must be positive, got {grad_bytes}")
            spec = _cluster(
                cluster,
                {
                    "devices": devices,
                    "peak_flops_per_s": peak_flops,
                    "mfu": mfu,
                    "bandwidth_bytes_per_s": bandwidth,
                    "latency_s": latency,
                    "device_hours_cap": device_hours_cap,
                    "micro_batch_size_sequences_max": micro_batch,
                    "overlap": overlap,
                },
            )
            inputs = _inputs(source, flops_per_token, params, tokens_per_sequence, swept)
            result = make_plan(
                inputs,
                spec,
                grad_bytes_per_param=grad_bytes,
                sync_every_steps=sync_every_steps,
                batch_sizes_sequences=grid,
            )
            result["notes"] += inputs.get("notes", [])
        except (InvalidInput, ValueError) as exc:
            _fail_invalid(exc)
        out_dir = output or inputs["out_dir"]
        if out_dir is not None:
            try:
                out_dir.mkdir(parents=True, exist_ok=True)
                paths = write_plan(out_dir, result)
            except (OSError, WriteFailed) as exc:
                console.print(f"error: cannot write the plan to {out_dir}: {exc}", markup=False, highlight=False)
                raise typer.Exit(1) from None
            report = _report(out_dir) if inputs["out_dir"] is not None and out_dir == inputs["out_dir"] else None
            console.print(
                f"wrote {paths['plan']}"
                + (f" and {paths['plot']}" if paths["plot"] else "")
                + (f"; added the plan to {report} (rewritten in place)" if report else ""),
                highlight=False,
            )
        console.print(plan_summary(result), markup=False, highlight=False)
        if inputs.get("b_opt_sentence"):
            console.print(inputs["b_opt_sentence"], markup=False, highlight=False)
        if out_dir is None or as_json:
            print(json.dumps(finite_json(result), indent=2))
