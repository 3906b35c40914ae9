"""A batch-size ramp against a fixed batch, trained: the main job's model and data, the same tokens, several seeds.

    python benchmarks/schedule_vs_fixed.py STUDY [--tokens 1048576] [--seeds 0 1 2] [--json FILE]
    python benchmarks/schedule_vs_fixed.py --from-json FILE     (the tables of a finished run again)

STUDY is a finished ``critbatch scale`` folder of the main job (``scale.json`` and ``members/tokens-*/`` with
``cbs.json`` and ``spec.yaml``). Two ramps, each in critbatch's own ``batch_warmup`` block
(``sweeps.scaling.schedule.critbatch_block``):

* ``law``: ``critbatch schedule STUDY/scale.json --total-tokens TOKENS``: each stage doubles the batch once the
  lower end of the law's 95 % prediction interval, read at the tokens seen, reaches it.
* ``points``: the members' measured ``b_crit`` read at the tokens seen (log-linear between budgets, the smallest
  member's below it): the first stage is the largest power of two under the smallest budget's ``b_crit``, and each
  stage doubles the batch once the interpolated ``b_crit`` reaches it.

Each ramp is trained against a fixed batch at its first stage (what it is compared with: the same tokens in more
steps) and a fixed batch at its last stage. Every run is the member's spec (``members/tokens-TOKENS/spec.yaml``:
model, data, LR warmup, weight EMA, milestones) built into a trial as a sweep builds it
(``sweeps.launch.trainable.trial_config``) and trained in this process (``workloads.pretrain.train_in_process``):
the LR of a fixed batch is the member's tuned best LR at that batch size (``lr_per_batch``; outside the swept
sizes, scaled from the nearest swept size by the square-root rule); a ramp's peak LR is the tuned LR of its last
stage, and the loop scales it to each earlier stage by the trial's rule (``--ramp-lr-rule``, default ``sqrt``,
``workloads.train.scaling.scaled_lr``; ``none`` keeps the peak LR at every stage); beta2 keeps the member's token
half-life at every batch. The noise-scale estimator is off (it measures, it does not change the step).

Prints per arm: optimizer steps, final validation loss (EMA weights; mean and sample standard deviation over the
seeds), wall time, then the validation loss at every milestone, then each ramp against its two fixed batches:
the mean paired difference (ramp - fixed, same seed) with a two-sided 95 % t interval over seeds, and the steps
each fixed batch took to reach the ramp's final loss (steps saved at equal loss, beside the ramp's steps saved at
equal tokens). ``--json`` writes every run's reports as well.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def interpolated_b_crit(points: list[tuple[float, float]], tokens: float) -> float:
    """``b_crit`` (sequences) at ``tokens``: log-linear between the ``(budget_tokens, b_crit)`` points (sorted by
    budget), the first point's value below the first budget and the last segment's line beyond the last."""
    if tokens <= points[0][0]:
        return points[0][1]
    for (d0, b0), (d1, b1) in zip(points, points[1:]):
        if tokens <= d1 or (d1, b1) == points[-1]:
            f = math.log(tokens / d0) / math.log(d1 / d0)
            return math.exp(math.log(b0) + f * math.log(b1 / b0))
    return points[0][1]  # one point: constant


def points_ramp(points: list[tuple[float, float]], total_tokens: int, tokens_per_sequence: int) -> dict[str, Any]:
    """A doubling ramp under the measured ``b_crit`` points, in the shape of
    ``sweeps.scaling.schedule.batch_size_ramp``'s ``stages`` (each stage starts on a whole step of the one before)."""
    first = 2 ** math.floor(math.log2(points[0][1]))
    stages, pos, steps, b = [], 0, 0, first
    while True:
        stages.append({"start_tokens": pos, "batch_size_sequences": b, "start_step": steps})
        lo, hi = float(max(pos, 1)), float(total_tokens)
        if interpolated_b_crit(points, hi) < 2 * b:
            break
        for _ in range(60):  # the first tokens at which b_crit reaches 2b (it grows with the tokens)
            mid = math.sqrt(lo * hi)
            lo, hi = (lo, mid) if interpolated_b_crit(points, mid) >= 2 * b else (mid, hi)
        n = math.ceil((hi - pos) / (b * tokens_per_sequence))
        pos, steps, b = pos + n * b * tokens_per_sequence, steps + n, 2 * b
    steps += math.ceil((total_tokens - pos) / (b * tokens_per_sequence))
    return {"stages": stages, "steps": steps, "tokens_per_sequence": tokens_per_sequence, "total_tokens": total_tokens}


def tuned_lr(cbs: dict[str, Any], batch_size_sequences: int) -> tuple[float, str]:
    """The member's best LR at a batch size (``cbs.json`` ``lr_per_batch``), or the nearest swept size's scaled by
    ``(B / B_swept) ** 0.5`` (Malladi et al. 2022); with where it came from."""
    rows = {r["batch_size_sequences"]: r["best_lr"] for r in cbs["lr_per_batch"] if r.get("best_lr")}
    if batch_size_sequences in rows:
        return rows[batch_size_sequences], "tuned"
    near = min(rows, key=lambda b: abs(math.log(b / batch_size_sequences)))
    return rows[near] * (batch_size_sequences / near) ** 0.5, f"sqrt rule from B={near}"


def arms(study: Path, tokens: int, ramp_lr_rule: str = "sqrt") -> tuple[list[dict[str, Any]], dict[str, Any], Any]:
    """The distinct arms (fixed batches and ramps, whose LR follows the batch by ``ramp_lr_rule``), the two ramps,
    and the member's spec dict."""
    import yaml

    from sweeps.scaling.schedule import batch_size_ramp, critbatch_block
    from workloads.train.scaling import LR_RULE_EXPONENTS

    alpha = LR_RULE_EXPONENTS[ramp_lr_rule]

    member = study / "members" / f"tokens-{tokens}"
    cbs = json.loads((member / "cbs.json").read_text())
    spec = yaml.safe_load((member / "spec.yaml").read_text())
    T = spec["model"]["context_length_tokens"]
    scale = json.loads((study / "scale.json").read_text())
    pts = sorted((m["tokens"], m["batch_size_sequences"]) for m in scale["members"])
    ramps = {"law": batch_size_ramp(scale, tokens, T), "points": points_ramp(pts, tokens, T)}
    out: dict[str, dict[str, Any]] = {}
    for name, ramp in ramps.items():
        block = critbatch_block(ramp)
        first, last = ramp["stages"][0]["batch_size_sequences"], block["final_batch_size_sequences"]
        for b in (first, last):
            lr, source = tuned_lr(cbs, b)
            out.setdefault(f"fixed {b}", {"arm": f"fixed {b}", "batch": b, "lr": lr, "lr_source": source})
        lr, source = tuned_lr(cbs, last)
        arm = f"ramp {name}" if ramp_lr_rule == "sqrt" else f"ramp {name}, LR {ramp_lr_rule}"
        out[arm] = {
            "arm": arm,
            "lr_rule": ramp_lr_rule,
            "batch": last,
            "lr": lr,
            "lr_source": f"{source}, at the last stage",
            "batch_warmup": block["batch_warmup"],
            "first": f"fixed {first}",
            "last": f"fixed {last}",
            "stages": [s["batch_size_sequences"] for s in ramp["stages"]],
            "stage_lrs": [lr * (s["batch_size_sequences"] / last) ** alpha for s in ramp["stages"]],
            "steps_predicted": ramp["steps"],
        }
    return list(out.values()), ramps, spec


def train(spec_dict: dict[str, Any], arm: dict[str, Any], seed: int, half_life_tokens: float) -> dict[str, Any]:
    """One run of an arm at a seed, as a sweep's trial of the member's spec, in this process."""
    from sweeps.launch.trainable import trial_config
    from sweeps.spec import parse_spec
    from workloads.pretrain import train_in_process
    from workloads.train.scaling import beta2_from_half_life

    d = json.loads(json.dumps(spec_dict))
    d["data"]["path"] = str(ROOT / "data" / "tinyshakespeare" / "input.txt")
    d["noise_scale"] = {"enabled": False}
    d["batch_warmup"] = arm.get("batch_warmup")
    d["search"].update(batch_sizes_sequences=[arm["batch"]], base_batch_size_sequences=arm["batch"], base_lr=arm["lr"])
    spec = parse_spec(d)
    T = spec.model.context_length_tokens
    params = {
        "batch_size_sequences": arm["batch"],
        "seed": seed,
        "lr": arm["lr"],
        "lr_rule": arm.get("lr_rule", "sqrt"),
        "beta2": beta2_from_half_life(half_life_tokens, arm["batch"], T),
        "beta2_half_life_tokens": half_life_tokens,
    }
    r = train_in_process(trial_config(spec, params, f"{arm['arm']}-{seed}").to_dict(), None, None)
    reps = r["reports"]
    return {
        "arm": arm["arm"],
        "seed": seed,
        "status": r["status"],
        "steps": reps[-1]["step"],
        "tokens_seen": reps[-1]["tokens_seen"],
        "val_loss": reps[-1]["val_loss"],
        "milestones": [(m["tokens_seen"], m["val_loss"]) for m in reps],
        "wall_s": r["wall_s"],
    }


def tokens_to_loss(milestones: list[tuple[float, float]], loss: float) -> float | None:
    """The tokens at which a run's validation loss first reaches ``loss``: linear between the two milestones
    around the crossing (the first milestone's tokens if it is already there), None if it never does."""
    prev = None
    for t, v in milestones:
        if v <= loss:
            if prev is None:
                return float(t)
            t0, v0 = prev
            return t0 + (t - t0) * (v0 - loss) / (v0 - v)
        prev = (t, v)
    return None


def paired(runs: list[dict[str, Any]], a: str, b: str) -> dict[str, Any] | None:
    """Ramp ``a`` against fixed batch ``b``, paired by seed.

    Returns:
        ``diff_mean`` of ``loss(a) - loss(b)`` over seeds with its two-sided 95 % t interval (n - 1 degrees of
        freedom), ``fixed_seed_sd`` (the sample standard deviation of ``b``'s final loss: seed-to-seed noise),
        the same over the mean of the last four milestones' losses (``diff_last4_mean``, ``diff_last4_ci95``: less
        evaluation noise, at the end of training), and at equal loss: ``fixed_steps_to_ramp_loss`` (per seed, the steps ``b`` took to reach the ramp's final
        loss, :func:`tokens_to_loss`; None where it never did) and ``steps_saved_at_equal_loss`` (``1 - ramp
        steps / those``, mean over the seeds where ``b`` reached it). None with fewer than two common seeds.
    """
    from scipy import stats

    ra = {r["seed"]: r for r in runs if r["arm"] == a}
    rb = {r["seed"]: r for r in runs if r["arm"] == b}
    seeds = sorted(set(ra) & set(rb))
    if len(seeds) < 2:
        return None

    def t_interval(diffs: list[float]) -> tuple[float, float]:
        mean = statistics.fmean(diffs)
        return mean, float(stats.t.ppf(0.975, len(diffs) - 1)) * statistics.stdev(diffs) / math.sqrt(len(diffs))

    mean, half = t_interval([ra[s]["val_loss"] - rb[s]["val_loss"] for s in seeds])
    last4 = [
        statistics.fmean(v for _, v in ra[s]["milestones"][-4:])
        - statistics.fmean(v for _, v in rb[s]["milestones"][-4:])
        for s in seeds
    ]
    mean4, half4 = t_interval(last4)
    fixed_steps = []
    for s in seeds:  # a fixed batch's steps are proportional to its tokens
        t = tokens_to_loss(rb[s]["milestones"], ra[s]["val_loss"])
        fixed_steps.append(None if t is None else t * rb[s]["steps"] / rb[s]["tokens_seen"])
    saved = [1 - ra[s]["steps"] / n for s, n in zip(seeds, fixed_steps) if n]
    return {
        "ramp": a,
        "fixed": b,
        "seeds": seeds,
        "diff_mean": mean,
        "diff_ci95": [mean - half, mean + half],
        "fixed_seed_sd": statistics.stdev(rb[s]["val_loss"] for s in seeds),
        "beyond_chance": not (mean - half <= 0 <= mean + half),
        "diff_last4_mean": mean4,
        "diff_last4_ci95": [mean4 - half4, mean4 + half4],
        "ramp_steps": [ra[s]["steps"] for s in seeds],
        "fixed_steps_to_ramp_loss": fixed_steps,
        "steps_saved_at_equal_loss": statistics.fmean(saved) if saved else None,
    }


def summary(arm_list: list[dict[str, Any]], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm: steps, final loss (mean, sd over seeds), mean wall time, mean loss at each milestone; and each
    ramp against its first-stage and last-stage fixed batches (:func:`paired`)."""
    rows = []
    for arm in arm_list:
        rs = [r for r in runs if r["arm"] == arm["arm"]]
        if not rs:
            continue
        losses = [r["val_loss"] for r in rs]
        rows.append(
            {
                "arm": arm["arm"],
                "stages": arm.get("stages", [arm["batch"]]),
                "lr": arm["lr"],
                "lr_source": arm["lr_source"],
                "steps": sorted({r["steps"] for r in rs}),
                "seeds": len(rs),
                "val_loss_mean": statistics.fmean(losses),
                "val_loss_sd": statistics.stdev(losses) if len(losses) > 1 else None,
                "wall_s_mean": statistics.fmean(r["wall_s"] for r in rs),
                "milestones": [
                    (t, statistics.fmean(r["milestones"][i][1] for r in rs))
                    for i, (t, _) in enumerate(rs[0]["milestones"])
                ],
            }
        )
    pairs = [
        p
        for arm in arm_list
        if "batch_warmup" in arm
        for p in (paired(runs, arm["arm"], arm["first"]), paired(runs, arm["arm"], arm["last"]))
        if p is not None
    ]
    return {"arms": rows, "ramp_vs_fixed": pairs}


def _equal_loss_words(saved: float | None) -> str:
    """The ramp's steps at equal loss against the fixed batch's, in words (a ramp that took more says more)."""
    if saved is None:
        return "never"
    return f"{100 * abs(saved):.0f} % {'fewer' if saved >= 0 else 'more'} steps at equal loss"


def print_tables(s: dict[str, Any]) -> None:
    """The result tables on stdout."""
    print(f"{'arm':<22}{'stages (sequences)':<20}{'peak LR':>9}{'steps':>9}{'final val loss':>22}{'wall s':>9}")
    for a in s["arms"]:
        sd = f" +- {a['val_loss_sd']:.4f}" if a["val_loss_sd"] is not None else ""
        st = "->".join(str(b) for b in a["stages"])
        steps = ",".join(str(n) for n in a["steps"])
        print(
            f"{a['arm']:<22}{st:<20}{a['lr']:>9.5f}{steps:>9}{a['val_loss_mean']:>15.4f}{sd:<7}{a['wall_s_mean']:>9.0f}"
        )
    print("\nvalidation loss (mean over seeds) at each milestone (tokens seen):")
    for a in s["arms"]:
        print(f"{a['arm']:<22}" + " ".join(f"{t}:{v:.3f}" for t, v in a["milestones"]))
    print("\nramp - fixed, final validation loss, paired by seed:")
    for p in s["ramp_vs_fixed"]:
        lo, hi = p["diff_ci95"]
        print(
            f"{p['ramp']:<22} vs {p['fixed']:<10} {p['diff_mean']:+.4f} [95 % {lo:+.4f}, {hi:+.4f}] "
            f"(seed sd of the fixed arm {p['fixed_seed_sd']:.4f}; {'beyond' if p['beyond_chance'] else 'within'} chance)"
        )
        lo4, hi4 = p["diff_last4_ci95"]
        print(
            f"{'':<22}    mean of the last four milestones: {p['diff_last4_mean']:+.4f} [95 % {lo4:+.4f}, {hi4:+.4f}]"
        )
        reached = [round(n) if n else "never" for n in p["fixed_steps_to_ramp_loss"]]
        saved = p["steps_saved_at_equal_loss"]
        print(
            f"{'':<22}    {p['fixed']} reached the ramp's final loss in {reached} steps (ramp: {p['ramp_steps']}): "
            + _equal_loss_words(saved)
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("study", type=Path, nargs="?", help="a finished critbatch scale folder of the main job")
    ap.add_argument("--tokens", type=int, default=1048576, help="tokens per run: a member's budget (default 1048576)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", help="run only these arms (e.g. 'fixed 8' 'ramp points'); default all")
    ap.add_argument(
        "--ramp-lr-rule",
        choices=["sqrt", "linear", "none"],
        default="sqrt",
        help="how a ramp's LR follows its batch down from the last stage's tuned LR (default sqrt)",
    )
    ap.add_argument("--half-life-tokens", type=float, default=32768.0, help="beta2's token half-life (the member's)")
    ap.add_argument("--json", type=Path, help="write the ramps, every run and the summary here (after each run)")
    ap.add_argument(
        "--from-json",
        type=Path,
        help="the tables of a --json file's runs again (and its summary to --json); no training",
    )
    args = ap.parse_args()
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        chosen = [a for a in saved["arms"] if any(r["arm"] == a["arm"] for r in saved["runs"])]
        saved["summary"] = summary(chosen, saved["runs"])
        print_tables(saved["summary"])
        if args.json:
            args.json.write_text(json.dumps(saved, indent=1) + "\n")
        return
    if args.study is None:
        ap.error("STUDY is required unless --from-json")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    arm_list, ramps, spec = arms(args.study, args.tokens, args.ramp_lr_rule)
    chosen = [a for a in arm_list if not args.arms or a["arm"] in args.arms]
    runs: list[dict[str, Any]] = []
    for seed in args.seeds:  # seed-major: an interrupted run leaves whole seeds
        for arm in chosen:
            runs.append(train(spec, arm, seed, args.half_life_tokens))
            r = runs[-1]
            print(f"  {r['arm']} seed {seed}: {r['steps']} steps, val loss {r['val_loss']:.4f}, {r['wall_s']:.0f} s")
            if args.json:
                out = {"study": str(args.study), "tokens": args.tokens, "ramps": ramps, "arms": arm_list, "runs": runs}
                args.json.write_text(json.dumps(out | {"summary": summary(chosen, runs)}, indent=1) + "\n")
    print_tables(summary(chosen, runs))


if __name__ == "__main__":
    main()
