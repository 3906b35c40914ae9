"""``critbatch scale``: the critical batch size across token budgets, fitted as a power law and predicted at a
production budget (:mod:`sweeps.scaling`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer

__all__ = ["register", "scale", "schedule"]


def _split_cbs(text: str) -> tuple[str, str]:
    """``--cbs PATH[:TOKENS]`` as ``(PATH, TOKENS)`` (``TOKENS`` empty when not given)."""
    path, _, tokens = text.rpartition(":") if ":" in text and not Path(text).exists() else (text, "", "")
    return path, tokens


def _sweep_folder(text: str) -> str:
    """The sweep folder a ``--cbs`` names (its ``cbs.json`` or the folder), resolved, to tell repeats apart."""
    path = Path(_split_cbs(text)[0]).resolve()
    return str(path.parent if path.name == "cbs.json" else path)


def _cbs_member(text: str, quantity: str, level: float):
    """``--cbs PATH[:TOKENS]`` as ``(member, its B_opt measured from the sweep's trials)``. Raises InvalidInput on
    a budget that is not a number."""
    from sweeps.errors import InvalidInput
    from sweeps.scaling import member_from_cbs
    from sweeps.scaling.b_opt import b_opt_member

    path, tokens = _split_cbs(text)
    try:
        budget = float(tokens) if tokens else None
    except ValueError:
        raise InvalidInput(f"--cbs {text!r}: the budget after ':' must be a number of tokens") from None
    member = member_from_cbs(Path(path), budget, quantity)
    return member, b_opt_member(Path(path), member.tokens, level=level)


def _refuse_repeats(given: list[str], sources: list[str], budgets: list[float]) -> None:
    """Refuse a member given twice (the same file or folder at the same budget): it would enter the law as two
    measurements. Raises InvalidInput naming it."""
    from sweeps.errors import InvalidInput

    seen: set[tuple[str, float]] = set()
    for text, key in zip(given, zip(sources, budgets)):
        if key in seen:
            raise InvalidInput(f"{text} is given twice: each member enters the law once")
        seen.add(key)


def _members(
    csv: list[Path],
    tokens: list[float],
    n_params: list[float],
    cbs: list[str],
    reference_batch: float | None,
    level: float,
    quantity: str,
) -> tuple[list, list]:
    """The study's members from the command line, and B_opt's (the sweep folders'). Raises InvalidInput on
    options that do not pair up."""
    from sweeps.errors import InvalidInput
    from sweeps.scaling import member_from_csv

    if len(csv) != len(tokens):
        raise InvalidInput(f"give one --tokens per --csv, in the same order: {len(csv)} --csv, {len(tokens)} --tokens")
    if n_params and len(n_params) != len(csv):
        raise InvalidInput(f"give one --n-params per --csv or none: {len(csv)} --csv, {len(n_params)} --n-params")
    if csv and reference_batch is None:
        raise InvalidInput("--csv needs --reference-batch (the B0 of each table's 20 % CBS)")
    if any(not 0 < n < math.inf for n in n_params):
        raise InvalidInput(f"--n-params must be positive, finite parameter counts, got {n_params}")
    _refuse_repeats([f"--csv {p} --tokens {d:g}" for p, d in zip(csv, tokens)], [str(p.resolve()) for p in csv], tokens)
    _refuse_repeats([f"--cbs {t}" for t in cbs], [_sweep_folder(t) for t in cbs], [0.0] * len(cbs))
    if not csv and not cbs:
        raise InvalidInput("give the study's members: --csv FILE --tokens D (repeat) and/or --cbs SWEEP[:TOKENS]")
    ref = reference_batch if reference_batch is not None else 0.0  # given whenever there is a --csv (above)
    members = [
        member_from_csv(path, d, ref, level=level, quantity=quantity, n_params=n_params[i] if n_params else None)
        for i, (path, d) in enumerate(zip(csv, tokens))
    ]
    swept = [_cbs_member(text, quantity, level) for text in cbs]
    return members + [m for m, _ in swept], [b for _, b in swept]


def _run_study(
    spec_path: Path,
    budgets: str | None,
    output: Path | None,
    predict_tokens: float | None,
    address: str | None,
    tracking_uri: str | None,
) -> dict:
    """Run or continue the study of ``spec_path`` (:func:`sweeps.scaling.run.run_study`). Raises InvalidInput."""
    from sweeps.errors import InvalidInput
    from sweeps.scaling.run import run_study
    from sweeps.spec import load_spec

    if output is None or not budgets:
        raise InvalidInput("a study (SPEC) needs --output STUDY_FOLDER and --budgets-tokens D1,D2,...")
    try:
        values = [int(float(x)) for x in budgets.split(",") if x.strip()]
    except ValueError:
        raise InvalidInput(f"--budgets-tokens must be comma-separated numbers of tokens, got {budgets!r}") from None
    return run_study(
        load_spec(spec_path),
        values,
        output,
        predict_tokens=predict_tokens,
        tracking_uri=tracking_uri,
        ray_address=address,
    )


def _tokens_per_sequence(member: Path) -> float | None:
    try:
        return float(json.loads((member / "cbs.json").read_text(encoding="utf-8"))["tokens_per_sequence"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def _write(path: Path, result: dict, study: dict | None) -> None:
    """``scale.json`` and its plot at ``path``; for a study, its MLflow run too (``result["mlflow"]``, then written
    again). Exits 1 naming the file when a write fails; an MLflow failure is a warning (the files stand)."""
    from critbatch.common import console
    from sweeps.errors import WriteFailed
    from sweeps.files import write_json
    from sweeps.scaling.plot import plot_study

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, result)
        plot_study(result, path.with_suffix(".png"))
        if study is not None:
            from sweeps.scaling.tracking import log_study

            try:
                result["mlflow"] = log_study(
                    study["name"],
                    result,
                    [path.parent / m["folder"] for m in study["members"]],
                    [path, path.with_suffix(".png")],
                )
            except Exception as exc:  # noqa: BLE001 - MLflow's errors vary by store; the files are written
                console.print(
                    f"warning: the study's MLflow run was not logged ({type(exc).__name__}: {exc})",
                    markup=False,
                    highlight=False,
                )
            write_json(path, result)
    except (OSError, WriteFailed) as exc:
        console.print(f"error: {exc}", markup=False, highlight=False)
        raise typer.Exit(1) from None


def scale(
    spec_path: Path | None = typer.Argument(
        None,
        metavar="[SPEC]",
        help="run a study: this sweep spec at each of --budgets-tokens, into --output (again: continue it)",
    ),
    budgets_tokens: str | None = typer.Option(
        None,
        "--budgets-tokens",
        help="with SPEC: comma-separated token budgets per trial, e.g. 131072,262144,524288,1048576",
    ),
    address: str | None = typer.Option(None, "--address", help="with SPEC: the Ray cluster (as run)"),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="with SPEC: the MLflow store"),
    csv: list[Path] | None = typer.Option(
        None,
        "--csv",
        help="a steps-to-target table at one budget (batch_size,steps_to_target, as analyze --csv reads); repeat it",
    ),
    tokens: list[float] | None = typer.Option(
        None, "--tokens", help="the training tokens D of each --csv, in the same order"
    ),
    n_params: list[float] | None = typer.Option(
        None, "--n-params", help="each --csv's model parameters (optional), to say whether model size can be told apart"
    ),
    cbs: list[str] | None = typer.Option(
        None,
        "--cbs",
        help="a finished sweep (folder or cbs.json), optionally :TOKENS (default: its spec's budget_tokens); repeat it",
    ),
    reference_batch: float | None = typer.Option(
        None, "--reference-batch", help="B0 of the tables' 20 % CBS (sequences); required with --csv"
    ),
    predict_tokens: float | None = typer.Option(
        None, "--predict-tokens", help="the production budget (tokens) to predict at"
    ),
    tokens_per_sequence: float | None = typer.Option(
        None, "--tokens-per-sequence", help="to give batch sizes in tokens too, and Step Law's in sequences"
    ),
    quantity: str = typer.Option(
        "b_crit", "--quantity", help="b_crit (E_min/S_min) or cbs_20 (Zhang et al.'s 20 % CBS, which carries 1.2 B0)"
    ),
    level: float = typer.Option(0.95, "--level", help="confidence level of the exponent and prediction"),
    output: Path | None = typer.Option(
        None, "--output", help="with SPEC: the study's folder; else a file to write scale.json to as well as stdout"
    ),
) -> None:
    """b_crit (and B_opt) as a power law of the token budget.

    Each member enters with its interval; the exponent gets an interval, the prediction a
    prediction interval that widens with the extrapolation, beside published laws as a cross-check.
    """
    from critbatch.common import console, fail_invalid
    from sweeps.analysis import finite_json
    from sweeps.errors import InvalidInput
    from sweeps.scaling import scale_result
    from sweeps.spec.statuses import SweepStatus

    study = None
    try:
        if tokens_per_sequence is not None and not 0 < tokens_per_sequence < math.inf:
            raise InvalidInput(f"--tokens-per-sequence must be positive and finite, got {tokens_per_sequence}")
        if spec_path is not None:
            study = _run_study(spec_path, budgets_tokens, output, predict_tokens, address, tracking_uri)
            assert output is not None  # _run_study refuses a study without --output
            if study["status"] != SweepStatus.SUCCEEDED:
                console.print(f"study {study['status']}: {output / 'study.json'}", markup=False, highlight=False)
                raise typer.Exit(study.get("exit_code") or 1)
            cbs = [f"{output / m['folder']}:{m['budget_tokens']}" for m in study["members"]]
            tokens_per_sequence = tokens_per_sequence or _tokens_per_sequence(output / study["members"][0]["folder"])
            predict_tokens = predict_tokens or study.get("predict_tokens")
            output = output / "scale.json"
        elif budgets_tokens or address or tracking_uri:
            raise InvalidInput("--budgets-tokens, --address and --tracking-uri go with SPEC (running a study)")
        elif output is not None and output.is_dir():
            raise InvalidInput(f"--output {output} is a folder: give the file to write scale.json to")
        members, b_opt_members = _members(
            csv or [], tokens or [], n_params or [], cbs or [], reference_batch, level, quantity
        )
        result = finite_json(
            scale_result(
                members,
                predict_tokens=predict_tokens,
                level=level,
                tokens_per_sequence=tokens_per_sequence,
                quantity=quantity,
                b_opt_members=b_opt_members,
            )
        )
    except InvalidInput as exc:
        fail_invalid(exc)
    if output is not None:
        _write(output, result, study)
    print(json.dumps(result, indent=2))
    console.print(result["answer"], markup=False, highlight=False)  # stderr: stdout stays JSON


def _read_local_cbs(path: Path) -> tuple[list[tuple[float, float]], float | None]:
    """``--local-cbs``: ``critbatch branch``'s points from a ``cbs.json`` or ``branch.json``, or the folder that
    holds one (its ``cbs.json`` when that has them, else its ``branch.json``), and the tokens per sequence of the
    run that measured them (the folder's ``cbs.json``; None when it has none). Raises InvalidInput."""
    from sweeps.errors import InvalidInput
    from sweeps.scaling.schedule import local_cbs_points

    files = [path / "cbs.json", path / "branch.json"] if path.is_dir() else [path]
    for file in files:
        try:
            doc = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("local_cbs"):
            return local_cbs_points(doc["local_cbs"]), _tokens_per_sequence(file.parent)
    raise InvalidInput(f"--local-cbs {path}: no local_cbs in {' or '.join(str(f) for f in files)} (critbatch branch)")


def _ramp(scale_json: Path | None, local_cbs: Path | None, total_tokens: float, tokens_per_sequence: int, top):
    """The ramp the command's inputs ask for: the law's alone (:func:`batch_size_ramp`) or under the local CBS too
    (:func:`bounded_ramp`). Raises InvalidInput."""
    from sweeps.errors import InvalidInput
    from sweeps.scaling.schedule import batch_size_ramp, bounded_ramp

    result = None
    if scale_json is not None:
        scale_json = scale_json / "scale.json" if scale_json.is_dir() else scale_json  # a study's folder
        try:
            result = json.loads(scale_json.read_text(encoding="utf-8"))
            result["gamma"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InvalidInput(f"{scale_json}: not a study's scale.json ({exc})") from None
    if local_cbs is None:
        if result is None:
            raise InvalidInput("give a study's scale.json, --local-cbs BRANCH_OUTPUT, or both")
        return batch_size_ramp(result, total_tokens, tokens_per_sequence, top)
    points, measured = _read_local_cbs(local_cbs)  # measured: the tokens per sequence of the branch run
    ramp = bounded_ramp(
        total_tokens, tokens_per_sequence, result=result, local_cbs=points, max_batch_size_sequences=top
    )
    if measured is not None and 0 < measured < math.inf and measured != tokens_per_sequence:
        ramp["warnings"].append(
            f"the local CBS was measured in sequences of {measured:g} tokens and is read here "
            f"as sequences of {tokens_per_sequence} (--tokens-per-sequence), not converted: a batch of B sequences "
            f"holds {tokens_per_sequence / measured:.3g}x the tokens of the local CBS measured at B"
        )
    return ramp


def schedule(
    scale_json: Path | None = typer.Argument(
        None, metavar="[SCALE_JSON]", help="a study's scale.json (critbatch scale), or the study's folder"
    ),
    local_cbs: Path | None = typer.Option(
        None,
        "--local-cbs",
        help="critbatch branch's output (folder, cbs.json or branch.json): stay under its local CBS too",
    ),
    total_tokens: float = typer.Option(..., "--total-tokens", help="the production run's training tokens"),
    tokens_per_sequence: int = typer.Option(
        ..., "--tokens-per-sequence", help="the production run's sequence length (tokens)"
    ),
    max_batch: int | None = typer.Option(
        None,
        "--max-batch-sequences",
        help="the largest global batch (default: under the law's lower bound at --total-tokens)",
    ),
    output: Path = typer.Option(
        ..., "--output", help="folder for schedule.json, megatron.txt, olmo_core.json, levanter.yaml and critbatch.yaml"
    ),
) -> None:
    """A batch-size ramp under b_crit, in trainers' formats.

    Each stage doubles the global batch once the lower end of the law's prediction interval at
    the tokens seen reaches it; with --local-cbs, once the lower of that and the local CBS
    measured by branching stays at or above it. The files give the same ramp in each trainer's
    own format.
    """
    from critbatch.common import console, fail_invalid
    from sweeps.errors import InvalidInput, WriteFailed
    from sweeps.files import write_atomic
    from sweeps.scaling.schedule import ramp_formats, schedule_files

    try:
        if output.exists() and not output.is_dir():
            raise InvalidInput(f"--output {output} is a file: give a folder for the schedule's files")
        ramp = _ramp(scale_json, local_cbs, total_tokens, tokens_per_sequence, max_batch)
    except InvalidInput as exc:
        fail_invalid(exc)
    try:
        output.mkdir(parents=True, exist_ok=True)
        for name, text in schedule_files(ramp_formats(ramp)).items():
            write_atomic(output / name, text)
    except (OSError, WriteFailed) as exc:
        console.print(f"error: cannot write the schedule to --output {output}: {exc}", markup=False, highlight=False)
        raise typer.Exit(1) from None
    stages = ramp["stages"]
    for warning in ramp["warnings"]:
        console.print(f"warning: {warning}", markup=False, highlight=False)
    if "bounds" in ramp:
        held = ", ".join(f"{s['batch_size_sequences']} from {s['start_tokens']:.3g} by {s['bound']}" for s in stages)
        console.print(f"stages held by: {held}", markup=False, highlight=False)
    console.print(
        f"{len(stages)} stages, {stages[0]['batch_size_sequences']} to {stages[-1]['batch_size_sequences']} "
        f"sequences: {ramp['steps']} steps for {total_tokens:.3g} tokens, "
        f"{100 * ramp['steps_saved_fraction']:.0f} % fewer than a fixed batch of "
        f"{ramp['fixed_batch_size_sequences']} ({ramp['fixed_steps']} steps); wrote {output}",
        markup=False,
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    """Add the ``scale`` and ``schedule`` commands to the ``critbatch`` app."""
    app.command("scale")(scale)
    app.command("schedule")(schedule)
