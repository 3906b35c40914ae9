"""The ``critbatch`` command line: the typer app, its local-sweep commands (validate, run, resume, analyze,
init-checkpoint) and the other command modules attached by name (:func:`_register_commands`). The top of the
layers: it may import sweeps, workloads and service; none of them imports it.

Exit codes: 0 success; 1 the sweep ran but failed (every trial failed, analysis impossible, or a
remote job failed); 2 invalid input (a bad spec, a missing file, a refused output folder, a sweep id
bound to another spec); 130 / 143 the sweep was stopped by SIGINT (Ctrl-C) / SIGTERM and
``critbatch resume OUT`` continues it.
"""

from __future__ import annotations

import json
import math
import sys
from importlib import metadata
from pathlib import Path

import typer
from rich.text import Text

from critbatch.common import EXIT_FAILED, console, out
from critbatch.common import fail_invalid as _fail_invalid
from sweeps.errors import CritbatchError, InvalidInput
from sweeps.settings import Settings
from sweeps.spec import load_spec
from sweeps.spec.result import CbsResult, is_comparison_record

#: the exit codes, as the main ``--help`` lists them (``\b`` keeps click from rewrapping the block)
EXIT_CODES_HELP = """\b
Exit codes:
  0    success
  1    the sweep ran but failed (every trial failed, no fit possible, a remote
       job failed or was stopped), or the cluster could not be reached
  2    invalid input: a bad spec, a missing file, a refused output folder, a
       sweep id bound to another spec
  130  stopped by Ctrl-C (SIGINT); `critbatch resume OUT` continues it
  143  stopped by SIGTERM; `critbatch resume OUT` continues it
"""

app = typer.Typer(
    help="critbatch: find the critical batch size of an LLM training run (Ray Tune + Optuna + MLflow).",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help: rich's option tables cut long option names and help at 80 columns
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version() -> str:
    try:
        return metadata.version("critbatch")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"critbatch {_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """The options before a command (``critbatch --version``); the commands do the work."""


@app.command()
def validate(spec: Path = typer.Argument(..., help="sweep spec (YAML)")) -> None:
    """Check a sweep spec and its data without running it.

    Exit 0, with doubtful choices printed as warnings, or 2 with every invalid field named by its
    path.
    """
    try:
        s = load_spec(spec)
        from sweeps.run.compare import naming_arm
        from sweeps.run.preflight import check_data_files, spec_warnings, window_warnings
        from sweeps.spec.milestones import check_milestones

        facts = None
        for i, (arm_name, arm) in enumerate(s.arm_specs()):  # a comparison: each arm as it will run, named
            with naming_arm(i, arm_name):
                check_milestones(arm)
                check_data_files(arm)
        if not s.arms:
            check_milestones(s)
            facts = check_data_files(s)
    except InvalidInput as exc:  # a SpecError is an InvalidInput
        _fail_invalid(exc)
    if s.arms:
        arms = s.arm_specs()
        for arm_name, arm in arms:
            out.print(
                f"arm {arm_name}: {len(arm.search.batch_sizes_sequences)} batch sizes x "
                f"{arm.search.trials_per_batch_size} trials x {len(arm.seeds)} seed(s) = {arm.n_trials} trials, "
                f"{arm.resources.workers_per_trial} worker(s) each",
                highlight=False,
            )
        out.print(
            f"ok: comparison '{s.name}' of {len(arms)} arms, {sum(a.n_trials for _, a in arms)} trials in all",
            highlight=False,
        )
        return
    out.print(
        f"ok: sweep '{s.name}': {len(s.search.batch_sizes_sequences)} batch sizes x "
        f"{s.search.trials_per_batch_size} trials x {len(s.seeds)} seed(s) = {s.n_trials} trials, "
        f"{s.budget_tokens} tokens each; LR placement: {s.search.strategy}"
        + (
            f"; then waves of {s.search.precision.trials_per_wave} until b_crit's interval is within "
            f"{s.search.precision.b_crit_ratio:g}x, up to {s.max_trials} trials' worth of tokens"
            if s.search.precision
            else ""
        ),
        highlight=False,
    )
    for warning in spec_warnings(s) + window_warnings(s, facts):
        console.print(f"warning: {warning}", markup=False, highlight=False)


#: ``--connect-timeout-s`` of ``run`` and ``resume`` (sweeps.launch.reach.DEFAULT_CONNECT_TIMEOUT_S is the 30)
_CONNECT_TIMEOUT_HELP = (
    "seconds a given Ray address (--address, $RAY_ADDRESS) may take to answer before the command "
    "exits 1 naming it, with nothing started (default: $CRITBATCH_RAY_CONNECT_TIMEOUT_S, else 30)"
)


@app.command()
def run(
    spec: Path = typer.Argument(..., help="sweep spec (YAML)"),
    output: Path = typer.Option(..., "--output", "-o", help="output folder (created; must not hold another sweep)"),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow tracking URI (overrides the spec)"),
    sweep_id: str | None = typer.Option(None, "--sweep-id", help="sweep id (default: NAME-TIMESTAMP)"),
    address: str | None = typer.Option(
        None,
        "--address",
        help="Ray cluster address, the head's GCS HOST:PORT (default: $RAY_ADDRESS, else start Ray in-process)",
    ),
    connect_timeout_s: float | None = typer.Option(None, "--connect-timeout-s", help=_CONNECT_TIMEOUT_HELP),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="live progress table"),
) -> None:
    """Run a sweep and find its critical batch size.

    Trials on Ray, search by Optuna, runs in MLflow; writes OUT/cbs.json and OUT/report.html.
    """
    from sweeps.run.api import run_sweep

    settings = _settings()
    _sweep_and_report(
        lambda: run_sweep(
            load_spec(spec),
            output,
            tracking_uri=tracking_uri,
            sweep_id=sweep_id,
            ray_address=address,
            ray_connect_timeout_s=_timeout(connect_timeout_s, settings),
            show_progress=progress,
            settings=settings,
        )
    )


@app.command()
def resume(
    output: Path = typer.Argument(..., help="output folder of an interrupted sweep"),
    address: str | None = typer.Option(
        None,
        "--address",
        help="Ray cluster address, the head's GCS HOST:PORT (default: $RAY_ADDRESS, else the one the sweep ran on)",
    ),
    connect_timeout_s: float | None = typer.Option(None, "--connect-timeout-s", help=_CONNECT_TIMEOUT_HELP),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Resume an interrupted sweep from its output folder.

    The Tune state, the Optuna studies and the MLflow runs are kept.
    """
    from sweeps.run.api import resume_sweep

    settings = _settings()
    _sweep_and_report(
        lambda: resume_sweep(
            output,
            ray_address=address,
            ray_connect_timeout_s=_timeout(connect_timeout_s, settings),
            show_progress=progress,
            settings=settings,
        )
    )


def _settings() -> Settings:
    """The ``CRITBATCH_*`` settings (:class:`sweeps.settings.Settings`), read once per command; exit 2 naming
    the variable whose value is malformed."""
    try:
        return Settings.from_env()
    except InvalidInput as exc:
        _fail_invalid(exc)
        raise  # not reached: _fail_invalid exits


def _timeout(connect_timeout_s: float | None, settings: Settings) -> float:
    """``--connect-timeout-s`` resolved (:func:`sweeps.launch.reach.ray_connect_timeout_s`); exit 2 when it, or
    ``CRITBATCH_RAY_CONNECT_TIMEOUT_S``, is not a positive number of seconds."""
    from sweeps.launch.reach import ray_connect_timeout_s

    try:
        return ray_connect_timeout_s(connect_timeout_s, settings)
    except InvalidInput as exc:
        _fail_invalid(exc)


def _sweep_and_report(call) -> None:
    """Run ``call()`` (a sweep), print its summary; exit 2 on invalid input, 1 on a failed sweep,
    128 + the signal on a sweep stopped by SIGINT or SIGTERM."""
    import optuna

    # one "A new study created in RDB" line per batch size said nothing the progress does not
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from sweeps.launch.reach import RayUnreachable

    try:
        result = call().to_dict()  # a sweeps.run.context.SweepResult
    except InvalidInput as exc:  # a SpecError is an InvalidInput
        _fail_invalid(exc)
    except RayUnreachable as exc:  # no sweep started: not "sweep failed"
        console.print(Text.assemble(("error:", "bold red"), f" {exc}"), highlight=False)
        raise typer.Exit(EXIT_FAILED)
    except CritbatchError as exc:
        console.print(Text.assemble(("sweep failed:", "bold red"), f" {exc}"), highlight=False)
        raise typer.Exit(EXIT_FAILED)
    _print_summary(result)
    if result.get("exit_code"):  # stopped by SIGINT or SIGTERM: 128 + the signal (130, 143); resumable
        raise typer.Exit(int(result["exit_code"]))
    if not result.get("ok", False):
        raise typer.Exit(EXIT_FAILED)


@app.command()
def analyze(
    csv: Path | None = typer.Option(
        None,
        "--csv",
        help="CSV with columns batch_size,steps_to_target[,seed][,group]; "
        "a batch size may repeat (one row per seed or trial)",
    ),
    trials: list[Path] | None = typer.Option(
        None,
        "--trials",
        help="OUT/trials.json of a finished sweep: re-analyse "
        "it (same output as OUT/cbs.json; cbs.json must lie beside it); "
        "repeat it to compare sweeps at the same targets (--target, else the "
        "first sweep's)",
    ),
    comparison: Path | None = typer.Option(
        None,
        "--comparison",
        help="OUT of a comparison (a spec with arms): "
        "re-analyse every arm at the first arm's targets, rewrite OUT/cbs.json "
        "and OUT/report.html (the runs' states are left as they are)",
    ),
    reference_batch: float | None = typer.Option(
        None,
        "--reference-batch",
        help="reference batch B0 for the 20% CBS (Zhang et al. 2024); required with --csv, else the sweep's",
    ),
    target: list[float] | None = typer.Option(
        None,
        "--target",
        metavar="LOSS",
        help="target loss (repeatable); --trials only: default, the sweep's own target rule",
    ),
    level: float = typer.Option(0.95, "--level", help="confidence level of b_crit_ci, in (0, 1)"),
    fit: str = typer.Option(
        "hyperbola", "--fit", help="the registered fit of steps against batch size (sweeps.analysis.fits)"
    ),
) -> None:
    """Fit S = S_min + E_min/B and print b_crit as JSON.

    The JSON holds b_crit, b_crit_ci and status for every fit. A knee outside the swept batch sizes
    is never printed as a bare number: b_crit is null and status says above_range, below_range or
    no_knee (b_crit_bound gives the side).
    """
    from sweeps.analysis import analyze_csv, analyze_trials_file, finite_json

    try:
        if sum(bool(x) for x in (csv, trials, comparison)) != 1:
            raise InvalidInput("give exactly one of --csv, --trials or --comparison")
        if not 0.0 < level < 1.0:
            raise InvalidInput(f"--level must lie in (0, 1), got {level}")
        if comparison is not None:
            if target or reference_batch is not None or level != 0.95 or fit != "hyperbola":
                raise InvalidInput(
                    "--comparison takes no --target, --reference-batch, --level or --fit: the arms are "
                    "analysed at the first arm's targets, as the comparison was"
                )
            from sweeps.run.compare import analyze_comparison

            result = analyze_comparison(comparison)
        elif csv is not None:
            if reference_batch is None:
                raise InvalidInput("--csv needs --reference-batch")
            if target:
                raise InvalidInput("--target goes with --trials (a CSV already holds steps to one target)")
            result = analyze_csv(csv, reference_batch, level=level, fit=fit)
        else:
            assert trials  # exactly one of --csv, --trials and --comparison, checked above
            if target and any(not math.isfinite(t) or t <= 0 for t in target):
                raise InvalidInput("--target must be a positive, finite loss")
            if len(trials) == 1:
                result = analyze_trials_file(
                    trials[0],
                    reference_batch=reference_batch,
                    targets=list(target) if target else None,
                    level=level,
                    fit=fit,
                )
            else:
                from sweeps.analysis import analyze_trials_files

                result = analyze_trials_files(
                    list(trials),
                    reference_batch=reference_batch,
                    targets=list(target) if target else None,
                    level=level,
                    fit=fit,
                )
    except InvalidInput as exc:
        _fail_invalid(exc)
    print(json.dumps(finite_json(result), indent=2))
    from sweeps.analysis.summary import analyze_note

    for one in result["sweeps"] if trials and len(trials) > 1 else [result]:
        one = one if isinstance(one, dict) else one.to_json_dict()  # a CbsResult: its cbs.json mapping
        console.print(
            (f"{one['path']}: " if "path" in one else "") + analyze_note(one), markup=False, highlight=False
        )  # stderr: stdout stays JSON


@app.command("init-checkpoint")
def init_checkpoint(
    directory: Path = typer.Argument(..., help="folder for the new checkpoint"),
    d_model: int = typer.Option(64, "--d-model", min=1, help="hidden size"),
    n_layers: int = typer.Option(2, "--n-layers", min=1, help="transformer blocks"),
    n_heads: int = typer.Option(4, "--n-heads", min=1, help="attention heads (must divide --d-model)"),
    context_length_tokens: int = typer.Option(1024, "--context-length-tokens", min=1, help="longest sequence, tokens"),
    family: str = typer.Option("llama", "--family", help="llama or gpt2"),
    seed: int = typer.Option(0, "--seed", help="initialisation seed"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace a checkpoint already there"),
) -> None:
    """Write a new byte-level causal LM checkpoint.

    A freshly initialised model and its tokenizer: a checkpoint to fine-tune offline.
    """
    from workloads.api import init_checkpoint as _init

    if family not in ("llama", "gpt2"):
        _fail_invalid(InvalidInput(f"--family must be 'llama' or 'gpt2', got {family!r}"))
    if d_model % n_heads:
        _fail_invalid(InvalidInput(f"--d-model ({d_model}) must be divisible by --n-heads ({n_heads})"))
    try:
        path = _init(
            str(directory),
            d_model,
            n_layers,
            n_heads,
            context_length_tokens,
            family=family,
            seed=seed,
            overwrite=overwrite,
        )
    except (ValueError, FileExistsError) as exc:
        _fail_invalid(exc)
    out.print(f"wrote {path}", highlight=False)


def _ci_text(ci: list | None) -> str:
    """`` [lo, hi] (95% CI)`` of an interval with a finite lower end (``hi`` None: unbounded); "" without one."""
    if not ci or ci[0] is None:
        return ""
    return f" [{ci[0]:.1f}, {f'{ci[1]:.1f}' if ci[1] is not None else 'unbounded'}] (95% CI)"


def _print_summary(result: dict) -> None:
    """What ``critbatch run`` and ``resume`` print after a sweep: ``result`` is
    :meth:`sweeps.run.context.SweepResult.to_dict`, whose ``cbs`` is ``cbs.json``'s content (a
    :class:`~sweeps.spec.result.CbsResult`) or a comparison's (a :class:`~sweeps.spec.result.ComparisonResult`,
    whose arms' own reports carry their numbers: only the message and the files written are printed)."""
    raw = result.get("cbs") or {}
    if not is_comparison_record(raw):
        _print_cbs(CbsResult.model_validate(raw), result.get("message"))
    elif result.get("message"):
        out.print(result["message"], highlight=False)
    if result.get("output"):
        out.print(f"wrote {result['output']}/cbs.json and {result['output']}/report.html", highlight=False)


def _print_cbs(cbs: CbsResult, message: str | None) -> None:
    """A sweep's answer: its headline, ``message``, ``b_crit`` for sizing (or why there is none) with the two
    other numbers beside it, what the interval does not cover and how the precision search stopped."""
    from sweeps.analysis.summary import headline, interval_ends_text, swept_range

    if cbs.target_loss is not None:
        out.print(cbs.headline or headline(cbs.to_json_dict()), markup=False, highlight=False)
    if message:
        out.print(message, highlight=False)
    if cbs.b_crit is not None:
        ci = cbs.b_crit_ci or [None, None]
        lo_t, hi_t = interval_ends_text(ci, swept_range(cbs.to_json_dict()))  # as report.html shows them: an end
        clipped = lo_t.startswith("<") or hi_t.startswith(">")  # past the fitted batch sizes is a bound only
        ci_text = (
            f"95 % interval [{lo_t}, {hi_t}]" + (" (cbs.json: the raw ends)" if clipped else "")
            if ci[0] is not None
            else "no interval"
        )
        out.print(
            f"size data parallelism with: critical batch size b_crit = {cbs.b_crit:.1f} sequences "
            f"({cbs.b_crit_tokens:.0f} tokens), {ci_text}, status {cbs.status}, at target loss "
            f"{cbs.target_loss:.4g} (a global batch of b_crit takes 2x the fewest steps and 2x the "
            "fewest tokens; past it, doubling the batch saves at most a quarter of the steps)",
            highlight=False,
        )
        out.print(_beside_b_crit(cbs), highlight=False)
    elif cbs.status and cbs.target_loss is not None:
        out.print(
            f"no critical batch size inside the swept range (status {cbs.status}"
            + (f", b_crit {cbs.b_crit_bound}" if cbs.b_crit_bound else "")
            + ")",
            highlight=False,
        )
    for note in cbs.caveats or []:
        out.print(f"not covered: {note}", highlight=False)
    if cbs.precision:
        out.print(_precision_text(cbs.precision), highlight=False)


def _beside_b_crit(cbs: CbsResult) -> str:
    """The two other numbers of ``cbs.json`` in one line, each with what it is and where its interval's width
    comes from: ``b_compute_overhead_20 = 0.2 b_crit`` (McCandlish et al. 2018, Eq. 2.11: the largest global batch
    within 20 % of the fewest tokens) and Zhang et al. 2024's 20 % CBS, ``0.2 b_crit + 1.2 B0`` under the same fit
    (its interval is ``b_crit``'s mapped through that line, so it looks narrower only by the constant ``1.2 B0``)."""
    over = cbs.b_compute_overhead_20
    parts = []
    if over is not None:
        parts.append(
            f"for the fewest tokens: global batches up to 0.2 b_crit = {over:.1f} sequences"
            f"{_ci_text(cbs.b_compute_overhead_20_ci)} cost at most 20 % more compute than the least"
        )
    if cbs.cbs_20 is not None:
        b0 = cbs.reference_batch
        parts.append(
            f"another definition, Zhang et al.'s 20% CBS from B0={f'{b0:g}' if isinstance(b0, (int, float)) else b0}: "
            f"{cbs.cbs_20:.1f} sequences{_ci_text(cbs.cbs_20_ci)} (b_crit's interval mapped through "
            "0.2 b_crit + 1.2 B0: narrower by the constant, not better known)"
        )
    return "beside it: " + "; ".join(parts) if parts else ""


def _precision_text(precision: dict) -> str:
    """``cbs.json``'s ``precision`` in one line: the interval's ratio reached against the one asked, and why
    the sweep stopped adding trials."""
    why = {
        "met": "the interval is as narrow as asked",
        "max_trials": f"search.precision.max_trials ({precision.get('max_trials')}) reached first",
        "nothing_to_add": "no trial was left to add",
        "budget": f"the sweep's budget ran out first ({precision.get('note', '')})",
        "interrupted": "the sweep was stopped before it decided",
        "analysis_failed": "a wave's analysis failed (see the log)",
    }.get(precision.get("stopped_because") or "", "?")
    ratio = precision.get("b_crit_ratio")
    return (
        f"precision: upper/lower {'unbounded' if ratio is None else f'{ratio:.3g}'} after "
        f"{precision.get('trials')} trials, asked <= {precision.get('b_crit_ratio_requested'):g}: {why}"
    )


def _register_commands() -> None:
    """Attach the command groups that live in modules of their own: submission and the service (cluster),
    Kubernetes, branching, data preparation, cluster planning, scaling across budgets, the MLflow UI. Each is imported here by name: a
    module that fails to import fails the program, never drops its commands quietly."""
    from critbatch import branch, cluster, data, k8s, plan, scale, ui

    for module in (cluster, k8s, branch, data, plan, scale, ui):
        module.register(app)


_register_commands()


def main() -> None:  # pragma: no cover - console entry
    """Run the ``critbatch`` program."""
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
