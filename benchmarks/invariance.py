"""Invariance experiments of docs/results.md: the answer must not move when it should not.

    python benchmarks/invariance.py --main OUT_MAIN [--budget OUT_2X --cut-tokens 262144]
        [--pruned OUT_PRUNED] [--seed1 OUT_SEED1] [--plots docs/results] [--json results.json]

Each ``OUT`` is a finished ``critbatch run`` output folder (its ``trials.json`` and ``cbs.json``).

* **(a) budget**: ``--budget`` is the main job at twice its token budget with milestones at the
  same tokens; its curves cut at ``--cut-tokens`` are what the main job's trials record (the schedule
  is horizon-free and training is deterministic for a fixed seed; the same Optuna suggestions, since
  the samplers are seeded by seed and batch size only). Both are analysed at the main job's targets,
  with the methodology's selection (minimum steps over a batch size's trials) and, for contrast, with
  the old selection (the trial with the lowest loss at the budget).
* **(b) pruning**: ``--pruned`` (the pruned example) against ``--main`` at the main job's targets.
* **(c) seeds**: ``--seed1`` (the main job with seed 1) against ``--main`` at the main job's targets.

Each comparison prints, per target, both ``b_crit`` with their 95 % intervals and whether the
intervals overlap; "agree" means each point estimate lies inside the other's interval.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# the analysis is imported where it is used, so that --help answers at once
if TYPE_CHECKING:
    from sweeps.analysis import TrialRecord


def load(out: Path) -> tuple[list[TrialRecord], dict[str, Any]]:
    """A finished sweep's records (``OUT/trials.json``) and its ``OUT/cbs.json``."""
    from sweeps.analysis import TrialRecord

    trials = [TrialRecord.from_dict(r) for r in json.loads((out / "trials.json").read_text())]
    return trials, json.loads((out / "cbs.json").read_text())


def cut(trials: list[TrialRecord], tokens: float) -> list[TrialRecord]:
    """The trials as a run with a budget of ``tokens`` records them: curves cut there; a trial that
    trained past the cut completed that shorter run."""
    from sweeps.analysis import TrialRecord

    out = []
    for t in trials:
        keep = [i for i, x in enumerate(t.tokens) if x <= tokens]
        if not keep:
            continue
        n = keep[-1] + 1
        status = t.status
        if (
            t.tokens
            and max(t.tokens) > tokens
            and status in ("COMPLETED", "DIVERGED")
            and math.isfinite(t.val_loss[n - 1])
        ):
            status = "COMPLETED"
        out.append(
            TrialRecord(
                trial_id=t.trial_id,
                batch_size_sequences=t.batch_size_sequences,
                seed=t.seed,
                group_id=t.group_id,
                status=status,
                hyperparameters=t.hyperparameters,
                tokens=t.tokens[:n],
                val_loss=t.val_loss[:n],
                flops=t.flops[:n],
                b_simple=t.b_simple[:n],
                pruning=t.pruning,
            )
        )
    return out


def best_at_budget_only(trials: list[TrialRecord]) -> list[TrialRecord]:
    """The old selection: per batch size and seed, only the completed trial with the lowest final loss."""
    best: dict[tuple[int, int], TrialRecord] = {}
    for t in trials:
        if t.final_loss is None:
            continue
        k = (t.batch_size_sequences, t.seed)
        if k not in best or t.final_loss < best[k].final_loss:
            best[k] = t
    return list(best.values())


def analyse(trials: list[TrialRecord], cbs: dict[str, Any], targets: list[float]) -> dict[str, Any]:
    """``analyze_trials`` on ``trials`` at ``targets``, with the sweep's context length and reference batch."""
    from sweeps.analysis import analyze_trials

    return analyze_trials(
        trials,
        context_length_tokens=int(cbs["context_length_tokens"]),
        reference_batch=float(cbs["reference_batch"]),
        targets=targets,
        tokens_per_sequence=cbs.get("tokens_per_sequence"),
    )


def _fmt_fit(t: dict[str, Any]) -> str:
    ci = t.get("b_crit_ci") or [None, None]
    b = f"{t['b_crit']:.1f}" if t.get("b_crit") is not None else (t.get("b_crit_bound") or "none")
    lo = f"{ci[0]:.1f}" if ci[0] is not None else "?"
    hi = f"{ci[1]:.1f}" if ci[1] is not None else "inf"
    return f"{b} [{lo}, {hi}] {t['status']}"


def _interval(t: dict[str, Any]) -> tuple[float, float] | None:
    ci = t.get("b_crit_ci")
    if not ci:
        return None
    return ci[0], ci[1] if ci[1] is not None else math.inf


def compare(name: str, a_name: str, a: dict[str, Any], b_name: str, b: dict[str, Any]) -> list[dict[str, Any]]:
    """Per target: both fits, whether the intervals overlap and whether each estimate lies in the other's interval."""
    rows = []
    print(f"\n({name}) {a_name} vs {b_name}")
    for ta, tb in zip(a["targets"], b["targets"]):
        ia, ib = _interval(ta), _interval(tb)
        overlap = bool(ia and ib and ia[0] <= ib[1] and ib[0] <= ia[1])
        agree = bool(
            ia
            and ib
            and ta.get("b_crit") is not None
            and tb.get("b_crit") is not None
            and ib[0] <= ta["b_crit"] <= ib[1]
            and ia[0] <= tb["b_crit"] <= ia[1]
        )
        rows.append({"target_loss": ta["target_loss"], a_name: ta, b_name: tb, "overlap": overlap, "agree": agree})
        print(
            f"  L*={ta['target_loss']:.3f}: {a_name} {_fmt_fit(ta)} (B {[p['batch_size_sequences'] for p in ta['points']]})"
            f" | {b_name} {_fmt_fit(tb)} (B {[p['batch_size_sequences'] for p in tb['points']]})"
            f" | overlap {'yes' if overlap else 'no'}, agree {'yes' if agree else 'no'}"
        )
    return rows


def _winners_changed(a: dict[str, Any], b: dict[str, Any]) -> list[int]:
    """Batch sizes whose best trial at the budget differs between two analyses."""
    ids = {p["batch_size_sequences"]: p["trial_ids_at_budget"] for p in b["per_batch"]}
    return [
        p["batch_size_sequences"]
        for p in a["per_batch"]
        if ids.get(p["batch_size_sequences"]) != p["trial_ids_at_budget"]
    ]


def plot(path: Path, title: str, series: dict[str, dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, (label, res) in enumerate(series.items()):
        pts = [t for t in res["targets"] if t.get("b_crit") is not None]
        if not pts:
            continue
        L = [t["target_loss"] + (i - (len(series) - 1) / 2) * 0.006 for t in pts]
        bc = [t["b_crit"] for t in pts]
        lo = [bc_ - max(t["b_crit_ci"][0], 1e-3) for t, bc_ in zip(pts, bc)]
        hi = [(t["b_crit_ci"][1] or 4 * bc_) - bc_ for t, bc_ in zip(pts, bc)]
        ax.errorbar(L, bc, yerr=[lo, hi], fmt="o", capsize=3, label=label)
    ax.set_yscale("log", base=2)
    ax.invert_xaxis()
    ax.set_xlabel("target validation loss")
    ax.set_ylabel("b_crit (sequences), 95 % CI")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    """Parse the arguments, then re-analyse the given sweeps and compare (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--main", type=Path, required=True, help="the main job's output folder")
    ap.add_argument("--budget", type=Path, help="the main job at twice its budget (experiment a)")
    ap.add_argument(
        "--cut-tokens", type=float, default=262144, help="the main job's budget, to cut --budget's curves at"
    )
    ap.add_argument("--pruned", type=Path, help="the pruned example's output folder (experiment b)")
    ap.add_argument("--seed1", type=Path, help="the main job with seed 1 (experiment c)")
    ap.add_argument("--plots", type=Path, help="folder for the PNG plots")
    ap.add_argument("--json", type=Path, help="write every fit here")
    a = ap.parse_args()
    from sweeps.analysis import analyze_trials, finite_json

    main_trials, main_cbs = load(a.main)
    targets = [t["target_loss"] for t in main_cbs["targets"]]
    print(
        f"main job: {len(main_trials)} trials, targets {[round(x, 3) for x in targets]}; headline "
        f"{_fmt_fit(main_cbs)} at {main_cbs['target_loss']:.3f}"
    )
    main_res = analyse(main_trials, main_cbs, targets)
    report: dict[str, Any] = {"targets": targets, "main": main_res}
    if a.budget:
        long_trials, long_cbs = load(a.budget)
        short = cut(long_trials, a.cut_tokens)
        res = {
            "1x_min": analyse(short, long_cbs, targets),
            "2x_min": analyse(long_trials, long_cbs, targets),
            "1x_best_final": analyse(best_at_budget_only(short), long_cbs, targets),
            "2x_best_final": analyse(best_at_budget_only(long_trials), long_cbs, targets),
        }
        report["budget"] = {
            "methodology_rule": compare("a", "1x", res["1x_min"], "2x", res["2x_min"]),
            "best_final_rule": compare("a, old selection", "1x", res["1x_best_final"], "2x", res["2x_best_final"]),
            "winners_changed": _winners_changed(res["1x_best_final"], res["2x_best_final"]),
            "2x_own_targets": analyze_trials(
                long_trials,
                context_length_tokens=int(long_cbs["context_length_tokens"]),
                reference_batch=float(long_cbs["reference_batch"]),
            ),
        }
        own = report["budget"]["2x_own_targets"]
        print(
            f"  batch sizes whose best trial at the budget changes from 1x to 2x: {report['budget']['winners_changed']}"
        )
        print(
            "  2x with its own (lower) targets: "
            + "; ".join(f"L*={t['target_loss']:.3f}: {_fmt_fit(t)}" for t in own["targets"])
        )
        if a.plots:
            plot(
                a.plots / "invariance_budget.png",
                "(a) budget: 1x vs 2x, minimum over trials",
                {"1x (cut at 262k tokens)": res["1x_min"], "2x": res["2x_min"]},
            )
    if a.pruned:
        p_trials, p_cbs = load(a.pruned)
        pres = analyse(p_trials, p_cbs, targets)
        report["pruning"] = compare("b", "main", main_res, "pruned", pres)
        if a.plots:
            plot(
                a.plots / "invariance_pruning.png",
                "(b) pruning: main job vs pruned example",
                {"main": main_res, "pruned": pres},
            )
    if a.seed1:
        s_trials, s_cbs = load(a.seed1)
        sres = analyse(s_trials, s_cbs, targets)
        report["seeds"] = compare("c", "seed0", main_res, "seed1", sres)
        report["seed1_own"] = s_cbs
        print(f"  seed 1 with its own targets: headline {_fmt_fit(s_cbs)} at {s_cbs['target_loss']:.3f}")
        if a.plots:
            plot(
                a.plots / "invariance_seeds.png",
                "(c) seeds: main job seed 0 vs seed 1",
                {"seed 0": main_res, "seed 1": sres},
            )
    if a.json:
        a.json.write_text(json.dumps(finite_json(report), indent=1, default=str))


if __name__ == "__main__":
    main()
