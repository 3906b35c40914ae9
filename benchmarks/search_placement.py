"""Where the search puts its trials, and what that does to ``b_crit``'s interval (issue 27): today's
independent per-batch-size search against learning-rate transfer, at the same compute, on simulated
sweeps with a known critical batch size and an error structure read off this project's cached LR grid.

    python benchmarks/search_placement.py                # 300 sweeps per strategy, about 1-2 min on 2 cores
    python benchmarks/search_placement.py --sweeps 1000
    python benchmarks/search_placement.py --sd-batch 0.1 --sd-trial 0.1 --precision-ratio 2
    python benchmarks/search_placement.py --strategies transfer+precision,transfer+precision+reallocation

**The model** (one simulated sweep; numbers read off the 42 curves of ``benchmarks/cache/search_efficiency``,
7 batch sizes x LR multipliers 0.7-4 of the square-root rule, tokens to loss 2.6 and 2.45):

* the truth: ``S(B) = S_min (1 + b_crit / B)`` (McCandlish et al. 2018, Eq. 2.11), ``b_crit`` drawn
  log-uniform in [8, 32] per sweep;
* the optimum LR ``lr*(B) = lr*_16 (B / 16)^a``, with ``a`` drawn uniform in [0, 0.5] per sweep (the grid's
  optimum moves from about 0.005 at B = 4-8 to 0.004-0.012 at B = 16-64: nearly flat) and the user's
  starting LR at B = 16 off by up to an octave either way;
* the cost of a wrong LR, asymmetric and growing with B: ``x = log2(lr / lr*)`` costs
  ``k (B / 16)^0.15 x^2`` in log tokens with ``k = 0.35`` above the optimum and ``0.2`` below (one octave
  above B = 16's optimum cost about 0.3 on the grid, one below about 0.17); past ``x = 2.5`` the trial
  diverges and never reaches a target;
* noise: lognormal in tokens, ``--sd-batch`` (default 0.05) shared by a batch size's trials and
  ``--sd-trial`` (0.04) per trial (the seed-to-seed spread of the loss on the grid is 0.6-4 %; next to
  a smooth curve over the multipliers the grid's log tokens scatter by up to about 0.1-0.25, so run
  ``--sd-batch 0.1 --sd-trial 0.1`` too);
* one token budget for every batch size (tokens to the middle loss at B = 64 and its optimum, times 1.5),
  16 milestones, so the largest batch sizes may not reach the lower targets (censored: they drop out,
  as in a real sweep);
* the analysis is the product's own: :func:`sweeps.analysis.analyze_trials` with its target rule and
  interval; the headline target is the product's choice.

**The placements**, 2 trials per batch size for both (14 trials, the main job's compute):

* ``independent`` (today's ``search.strategy``): each batch size draws its 2 configurations at random,
  an LR scaling rule among linear, square root and none times a multiplier log-uniform in [0.5, 2]
  (the example spec's space), around the user's starting LR;
* ``transfer`` (a model of ``search.strategy: transfer``, sweeps/search/transfer.py, not that code): batch
  sizes run outward from 16 (16, 8, 32, 4, 64, 128, 256); the first gets the starting LR times
  2^(-0.5) and 2^(+0.5); each next batch size centres on the nearest finished batch size's best LR (its
  faster trial) scaled by (B ratio)^alpha, alpha 0.5 until three batch sizes have finished, then the
  fitted :func:`sweeps.analysis.lr_scaling.lr_exponent_fit` over their best LRs (clipped to [0, 1]),
  with its two trials half an octave either side.

and a third, ``transfer+precision``: ``transfer``, then ``search.precision: {b_crit_ratio: 3, max_trials: 28}``'s
waves of 2 trials, chosen by the product's own :func:`sweeps.search.precision.propose`, until the interval is
within 3x, judged (and finally analysed) at the targets its first wave declared: it spends more than 14
trials where the first wave is too wide, and its stopping rule (stop once the interval is narrow enough)
is what its coverage measures.

and a fourth, ``transfer+precision+reallocation``: the third with token reallocation (a model of
``search.precision.reallocate_tokens``, sweeps/search/precision.py, not that code): after the first wave every
added trial ends at its first milestone at or below the lowest declared target, a batch size the fit holds as
censored there is first re-run at its trial with the lowest last loss, with twice the budget it had (at most
4; the same curve, as a deterministic re-run with the same seed and LR gives), and compute is counted in
budgets: a wave spends 2 budgets plus what earlier waves saved, the sweep at most 28.

Printed per strategy: ``coverage=`` (the 95 % interval holds the truth; an open end counts as open),
``median_width_ratio=`` (upper / lower end; inf when open), ``median_log2_bias=`` (log2 of the
estimate over the truth, over sweeps with an estimate), how many sweeps gave status ok, the mean
number of trials and the mean tokens trained in budgets (``mean_compute_trials``: below the trials when some ended
early); then how often a censored point contradicts the headline fit (``cbs.json``'s
``fit_consistent: false``) and the coverage and bias among those sweeps and the others.
What this does not show: that real searches have this error structure beyond the grid it was read off
(one model, one seed per configuration); the independent strategy's real sampler is Optuna's TPE per
batch size, not uniform draws (with 2 trials per batch size TPE has not started learning).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sweeps.analysis import TrialRecord, analyze_trials  # noqa: E402
from sweeps.analysis.lr_scaling import LR_RULE_EXPONENTS, lr_exponent_fit  # noqa: E402
from sweeps.search.precision import budgets_trained, precise_enough, propose  # noqa: E402

T = 64  # tokens per sequence
BATCH_SIZES = [4, 8, 16, 32, 64, 128, 256]
BASE = 16
TRANSFER_ORDER = [16, 8, 32, 4, 64, 128, 256]
S_MIN = 200.0
K_ABOVE, K_BELOW, K_GROWTH, DIVERGE_OCTAVES = 0.35, 0.2, 0.15, 2.5


class Sweep:
    """One simulated sweep's truth and its batch sizes' shared errors."""

    def __init__(self, rng: np.random.Generator, sd_batch: float, sd_trial: float):
        self.rng, self.sd_trial = rng, sd_trial
        self.b_crit = float(np.exp(rng.uniform(math.log(8), math.log(32))))
        self.alpha = float(rng.uniform(0.0, 0.5))
        self.lr16 = 0.005
        self.start_lr = self.lr16 * 2 ** rng.uniform(-1, 1)
        self.sd_batch = sd_batch
        self.e_batch = {b: rng.normal(0, sd_batch) for b in BATCH_SIZES}
        self.budget = self.tokens_mid(64, penalty=0.0) * 1.5
        self.milestones = np.linspace(self.budget / 16, self.budget, 16)
        self.targets: list[float] | None = None  # set by transfer_until_precise: its first wave's targets

    def tokens_mid(self, b: int, penalty: float) -> float:
        """Tokens to the middle loss (2.0 on the curve below) at batch size ``b`` with a log-token penalty."""
        return S_MIN * (1 + self.b_crit / b) * b * T * math.exp(penalty)

    def trial(self, tid: str, b: int, lr: float, *, budget_multiple: int = 1, stop_at_loss: float | None = None,
              penalty: float | None = None) -> tuple[TrialRecord, float]:
        """A trial at ``(b, lr)``: its record and its tokens to the middle loss (inf if it diverged).

        ``budget_multiple``: its token budget in sweep budgets (milestones at the same spacing past the first
        budget); ``stop_at_loss``: it ends at its first milestone at or below this loss (token reallocation);
        ``penalty``: its log-token penalty, given for a re-run of a trial (same seed and LR: the same curve)."""
        x = math.log2(lr / (self.lr16 * (b / BASE) ** self.alpha))
        grow = (b / BASE) ** K_GROWTH
        spacing = self.budget / 16
        tok = np.arange(1, 16 * budget_multiple + 1) * spacing
        if x > DIVERGE_OCTAVES:
            return TrialRecord(trial_id=tid, batch_size_sequences=b, seed=0, group_id=tid, status="DIVERGED",
                               hyperparameters={"lr": lr}, tokens=list(tok[:2]), val_loss=[9.0, 9.0],
                               flops=list(tok[:2] * 10.0)), math.inf
        if b not in self.e_batch:  # a batch size search.precision added beyond the grid
            self.e_batch[b] = self.rng.normal(0, self.sd_batch)
        if penalty is None:
            penalty = (K_ABOVE if x > 0 else K_BELOW) * grow * x * x + self.e_batch[b] + self.rng.normal(0, self.sd_trial)
        mid = self.tokens_mid(b, penalty)
        loss = 1.0 + 1.0 * (tok / mid) ** -0.5  # loss 2.0 at tokens_mid; the hyperbola holds at every target
        if stop_at_loss is not None and (loss <= stop_at_loss).any():
            end = int(np.argmax(loss <= stop_at_loss)) + 1
            tok, loss = tok[:end], loss[:end]
        rec = TrialRecord(trial_id=tid, batch_size_sequences=b, seed=0, group_id=tid, status="COMPLETED",
                          hyperparameters={"lr": lr, "penalty": penalty}, tokens=list(tok), val_loss=list(loss),
                          flops=list(tok * 10.0))
        return rec, mid


def independent(sweep: Sweep) -> list[TrialRecord]:
    """Two random configurations per batch size: a rule of three, a multiplier log-uniform in [0.5, 2]."""
    rng, out = sweep.rng, []
    for b in BATCH_SIZES:
        for k in range(2):
            rule = list(LR_RULE_EXPONENTS)[rng.integers(0, 3)]
            lr = sweep.start_lr * (b / BASE) ** LR_RULE_EXPONENTS[rule] * 2 ** rng.uniform(-1, 1)
            out.append(sweep.trial(f"B{b}-{k}", b, lr)[0])
    return out


def transfer(sweep: Sweep) -> list[TrialRecord]:
    """Batch sizes outward from 16, each centred on its nearest finished neighbour's best LR (see above)."""
    out, best = [], {}
    for b in TRANSFER_ORDER:
        if not best:
            centre = sweep.start_lr
        else:
            near = min(best, key=lambda f: (abs(math.log(b / f)), f))
            fit = lr_exponent_fit(list(best), list(best.values())) if len(best) >= 3 else None
            alpha = min(max(fit["alpha"], 0.0), 1.0) if fit else 0.5
            centre = best[near] * (b / near) ** alpha
        runs = [sweep.trial(f"B{b}-{k}", b, centre * 2 ** s) for k, s in enumerate((-0.5, 0.5))]
        out += [r for r, _ in runs]
        fastest = min(runs, key=lambda r: r[1])
        if math.isfinite(fastest[1]):
            best[b] = fastest[0].hyperparameters["lr"]
    return out


def transfer_until_precise(sweep: Sweep, ratio: float = 3.0, max_trials: int = 28, per_wave: int = 2) -> list[TrialRecord]:
    """``transfer``, then ``search.precision``'s waves (the product's own :func:`propose` and
    :func:`precise_enough`) until the interval's upper/lower ratio is at most ``ratio``, ``max_trials`` trials
    are spent, or nothing is left to add. A new batch size gets two trials half an octave either side of
    its neighbour's best LR times the square-root rule, as ``transfer`` places one."""
    out = transfer(sweep)
    while len(out) < max_trials:
        res = analyze_trials(out, context_length_tokens=T, reference_batch=BASE, targets=sweep.targets)
        if sweep.targets is None:  # the first wave declares the targets, as the product's searcher does
            sweep.targets = [t["target_loss"] for t in res.get("targets") or []] or None
        if precise_enough(res, ratio):
            break
        spacing = sweep.budget / 16
        props = propose(res, out, 100, allowed_batch_size=lambda b: b * T <= spacing)
        if not props:
            break
        # one wave, as the searcher fills it (sweeps/search/waves.py, _fit_to_room)
        room, before = min(max_trials - len(out), max(per_wave, 1 if props[0].lr is not None else 2)), len(out)
        for p in props:
            b, n = p.batch_size_sequences, len(out)
            cost = 1 if p.lr is not None else 2  # as the searcher's _fit_to_room counts them
            if cost > room:
                continue
            room -= cost
            if p.lr is not None:
                out.append(sweep.trial(f"B{b}-{n}", b, p.lr)[0])
                continue
            done = [r for r in out if r.status == "COMPLETED"]
            near = min({r.batch_size_sequences for r in done}, key=lambda f: (abs(math.log(b / f)), f))
            fastest = min((r for r in done if r.batch_size_sequences == near), key=lambda r: r.val_loss[-1])
            centre = fastest.hyperparameters["lr"] * (b / near) ** 0.5
            out += [sweep.trial(f"B{b}-{n + k}", b, centre * 2 ** s)[0] for k, s in enumerate((-0.5, 0.5))]
        if len(out) == before:  # nothing fitted the room left
            break
    return out


def _compute(records: list[TrialRecord], budget: float) -> float:
    """Tokens trained by the records, in full trials (sweep budgets), as the product counts them."""
    return budgets_trained(records, budget, 1)


def transfer_until_precise_reallocated(sweep: Sweep, ratio: float = 3.0, max_trials: int = 28, per_wave: int = 2,
                                       max_multiple: int = 4) -> list[TrialRecord]:
    """``transfer_until_precise`` with token reallocation: after the first wave (which declares the targets),
    every added trial ends at its first milestone at or below the lowest declared target (it can inform no
    lower one), and a batch size the fit holds as censored at that target is re-run first, at its trial with
    the lowest last loss (same LR and seed: the same curve, the model of a deterministic re-run), with twice
    the budget it had (at most ``max_multiple`` budgets). Compute is counted in tokens: a wave may spend
    ``per_wave`` budgets plus what the previous waves' early stops saved, and the sweep at most ``max_trials``
    budgets."""
    out = transfer(sweep)
    first, allowed = len(out), 0.0  # budgets the later waves were allowed so far
    while _compute(out, sweep.budget) < max_trials - 1e-9:
        res = analyze_trials(out, context_length_tokens=T, reference_batch=BASE, targets=sweep.targets)
        if sweep.targets is None:
            sweep.targets = [t["target_loss"] for t in res.get("targets") or []] or None
        if precise_enough(res, ratio) or not sweep.targets:
            break
        lowest = min(sweep.targets)
        low = min(res.get("targets") or [], key=lambda t: t["target_loss"], default={})
        extend = []
        for c in low.get("censored_points") or []:
            b = c["batch_size_sequences"]
            ts = [r for r in out if r.batch_size_sequences == b and r.status == "COMPLETED"]
            if not ts:
                continue
            best = min(ts, key=lambda r: r.val_loss[-1])
            had = int(round(max(max(r.tokens) for r in ts) / sweep.budget))
            if 2 * had <= max_multiple:
                extend.append((b, best, 2 * had))
        spacing = sweep.budget / 16
        props = propose(res, out, 100, allowed_batch_size=lambda b: b * T <= spacing)
        if not extend and not props:
            break
        left = max_trials - _compute(out, sweep.budget)
        first_cost = extend[0][2] if extend else (1 if props[0].lr is not None else 2)
        saved = max(0.0, allowed - _compute(out[first:], sweep.budget))  # what the early stops left unspent
        room = min(left, max(per_wave, first_cost) + saved)
        allowed += max(per_wave, first_cost)
        before = len(out)
        for b, best, m in extend:
            if m <= room:
                room -= m
                out.append(sweep.trial(f"B{b}-{len(out)}", b, best.hyperparameters["lr"], budget_multiple=m,
                                       stop_at_loss=lowest, penalty=best.hyperparameters["penalty"])[0])
        for p in props:
            b, n = p.batch_size_sequences, len(out)
            cost = 1 if p.lr is not None else 2
            if cost > room:
                continue
            room -= cost
            if p.lr is not None:
                out.append(sweep.trial(f"B{b}-{n}", b, p.lr, stop_at_loss=lowest)[0])
                continue
            done = [r for r in out if r.status == "COMPLETED"]
            near = min({r.batch_size_sequences for r in done}, key=lambda f: (abs(math.log(b / f)), f))
            fastest = min((r for r in done if r.batch_size_sequences == near), key=lambda r: r.val_loss[-1])
            centre = fastest.hyperparameters["lr"] * (b / near) ** 0.5
            out += [sweep.trial(f"B{b}-{n + k}", b, centre * 2 ** s, stop_at_loss=lowest)[0]
                    for k, s in enumerate((-0.5, 0.5))]
        if len(out) == before:
            break
    return out


STRATEGIES = {"independent": independent, "transfer": transfer, "transfer+precision": transfer_until_precise,
              "transfer+precision+reallocation": transfer_until_precise_reallocated}


def score(strategy: str, sweeps: int, seed: int, level: float, sd_batch: float, sd_trial: float) -> dict[str, float]:
    """``coverage``, ``median_width_ratio``, ``median_log2_bias`` and ``ok`` (sweeps with status ok) of
    ``sweeps`` simulated sweeps placed by ``strategy``."""
    rng = np.random.default_rng(seed)
    hits, ratios, biases, ok, trials, compute = 0, [], [], 0, [], []
    flagged: list[tuple[bool, bool, float | None]] = []  # (a censored point contradicts the fit, covered, log2 bias)
    for _ in range(sweeps):
        sweep = Sweep(rng, sd_batch, sd_trial)
        records = STRATEGIES[strategy](sweep)
        trials.append(len(records))
        compute.append(_compute(records, sweep.budget))
        res = analyze_trials(records, context_length_tokens=T, reference_batch=BASE, level=level, targets=sweep.targets)
        ci = res.get("b_crit_ci")
        lo, hi = (ci[0] or 0.0, ci[1] if ci[1] is not None else math.inf) if ci else (0.0, math.inf)
        hits += lo <= sweep.b_crit <= hi
        contradicted = any(c.get("fit_consistent") is False for c in res.get("censored_points") or [])
        flagged.append((contradicted, lo <= sweep.b_crit <= hi,
                        math.log2(res["b_crit"] / sweep.b_crit) if res.get("b_crit") else None))
        ratio = hi / lo if lo > 0 else math.inf
        ratios.append(ratio if ratio == ratio else math.inf)  # a NaN end: no interval
        if res.get("b_crit"):
            biases.append(math.log2(res["b_crit"] / sweep.b_crit))
        ok += res.get("status") == "ok"
    out = {"coverage": hits / sweeps, "median_width_ratio": float(np.median(ratios)),
           "median_log2_bias": float(np.median(biases)) if biases else math.nan, "ok": ok / sweeps,
           "mean_trials": float(np.mean(trials)),
           "mean_compute": float(np.mean(compute)), "contradicted": sum(f[0] for f in flagged) / sweeps}
    for name, group in (("contradicted", [f for f in flagged if f[0]]), ("consistent", [f for f in flagged if not f[0]])):
        b = [f[2] for f in group if f[2] is not None]
        out[f"coverage_{name}"] = sum(f[1] for f in group) / len(group) if group else math.nan
        out[f"median_log2_bias_{name}"] = float(np.median(b)) if b else math.nan
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sweeps", type=int, default=300, help="simulated sweeps per strategy")
    ap.add_argument("--level", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sd-batch", type=float, default=0.05, help="log-token noise shared by a batch size's trials")
    ap.add_argument("--sd-trial", type=float, default=0.04, help="log-token noise per trial")
    ap.add_argument("--precision-ratio", type=float, default=3.0,
                    help="transfer+precision: the interval's upper/lower ratio asked for (at most 28 trials)")
    ap.add_argument("--strategies", default=",".join(STRATEGIES),
                    help=f"comma-separated placements to score (default: all of {', '.join(STRATEGIES)})")
    a = ap.parse_args()
    names = [n.strip() for n in a.strategies.split(",") if n.strip()]
    unknown = sorted(set(names) - set(STRATEGIES))
    if unknown:
        ap.error(f"--strategies: unknown placement(s) {', '.join(unknown)}; choose from {', '.join(STRATEGIES)}")
    STRATEGIES["transfer+precision"] = lambda sweep: transfer_until_precise(sweep, ratio=a.precision_ratio)
    STRATEGIES["transfer+precision+reallocation"] = lambda sweep: transfer_until_precise_reallocated(
        sweep, ratio=a.precision_ratio)
    for name in names:  # the same seed: the same truths, starting LRs and shared errors for both
        s = score(name, a.sweeps, a.seed, a.level, a.sd_batch, a.sd_trial)
        print(f"{name}: coverage={s['coverage']:.3f} median_width_ratio={s['median_width_ratio']:.2f} "
              f"median_log2_bias={s['median_log2_bias']:+.3f} status_ok={s['ok']:.2f} "
              f"mean_trials={s['mean_trials']:.1f} mean_compute_trials={s['mean_compute']:.1f} ({a.sweeps} sweeps)", flush=True)
        print(f"  a censored point contradicts the headline fit in {s['contradicted']:.2f} of the sweeps: coverage "
              f"{s['coverage_contradicted']:.3f}, median log2 bias {s['median_log2_bias_contradicted']:+.3f} there; "
              f"{s['coverage_consistent']:.3f} and {s['median_log2_bias_consistent']:+.3f} in the others", flush=True)


if __name__ == "__main__":
    main()
