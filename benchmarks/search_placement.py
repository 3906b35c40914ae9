"""The product's search on simulated training curves: the replay of ``benchmarks/real_coverage.py`` run on synthetic
grids whose structure is read off the real grid, so that coverage can be measured over many sweeps, and with truths
other than the main job's.

    python benchmarks/search_placement.py calibrate                  # the model's parameters from the real grid
    python benchmarks/search_placement.py --sweeps 100               # the shipped code on 100 simulated sweeps
    python benchmarks/search_placement.py --sweeps 100 --baseline-rev f89663f   # and the code at a revision
    python benchmarks/search_placement.py --sweeps 100 --vary-truth  # b_crit scaled by up to 2x either way per sweep

**The model** (one simulated training seed of one sweep; ``benchmarks/cache/real_coverage/calibration.json``, made
by ``calibrate`` from ``benchmarks/cache/real_coverage/grid.jsonl``): the tokens a trial at batch size ``B`` and LR
``lr`` needs to first reach loss ``L`` are

    log T = log(S_min(L) (1 + b_crit(L) / B) B T_ctx)          the truth: McCandlish et al. 2018, Eq. 2.11
            + k_(above|below) (x - x*(B, L))^2                  the cost of a wrong LR, x = log2 lr
            + e_seed w(B) + e_cell                              a seed's effect on every batch size; the rest

with ``b_crit(L)`` and ``S_min(L)`` the real grid's reference fits (interpolated in L; ``b_crit`` held and
``log S_min`` extended linearly past the table), the optimum ``x*(B, L) = x0 + a log2(B / 16) + m (L - 2.6)``
(**the optimum LR moves with the target loss**: ``m`` octaves per nat, fitted on the grid's fastest LRs at losses
2.5-2.8 and held outside them), ``w(B) = B / (B + b_crit(2.6))`` (**a seed's effect shared across
batch sizes**, larger where steps, not tokens, set the pace), ``e_seed ~ N(0, sd_seed)`` per seed and
``e_cell ~ N(0, sd_cell)`` per (seed, batch size, LR); past ``x - x* > diverge_octaves`` a trial diverges. Each
milestone's loss is the ``L`` at which ``T`` equals its tokens. The search, the waves and the analysis are the
product's own (:func:`real_coverage.replay`), at the lattice LRs it asks for; the truth at a target is
``b_crit(L)``.

Printed: as ``benchmarks/real_coverage.py`` (``coverage=``, ``median_width_ratio=``, ``median_log2_bias=``,
``compute_trials=``, per target and overall), the truth in place of the reference. What it does not show: that
real training has no structure beyond these terms; the model is judged by whether, run with the code at a
revision, it reproduces that revision's coverage on the real grid (docs/benchmarks.md, "Real-training coverage").
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np
import real_coverage
import real_grid

CALIBRATION = ROOT / "benchmarks" / "cache" / "real_coverage" / "calibration.json"
L_REF = 2.6
#: the losses over which the optimum LR's drift ``m`` was measured (the calibration's targets); held constant outside
DRIFT_RANGE = (2.5, 2.8)
LOSS_GRID = np.linspace(1.9, 6.0, 821)


def _reference_table(cells: dict, seeds: list[int], losses: np.ndarray) -> dict[str, list[float]]:
    """``b_crit(L)`` and ``S_min(L)`` of the real grid's reference at each loss where it has a fit."""
    from sweeps.analysis.fit import fit_hyperbola

    out: dict[str, list[float]] = {"loss": [], "b_crit": [], "s_min": []}
    for L in losses:
        ref = real_coverage.reference(cells, float(L), seeds)
        pts = ref["points"]
        if len(pts) < 4:
            continue
        f = fit_hyperbola([p[0] for p in pts], [p[1] for p in pts])
        if not (0 < f.b_crit < math.inf):
            continue
        out["loss"].append(float(L))
        out["b_crit"].append(f.b_crit)
        out["s_min"].append(f.s_min)
    return out


def calibrate(cells: dict) -> dict[str, Any]:
    """The model's parameters read off the real grid (module docstring)."""
    seeds = sorted({s for s, _, _ in cells})
    table = _reference_table(cells, seeds, np.round(np.arange(2.3, 3.61, 0.05), 4))
    rows = []  # (log2 B/16, L - L_REF, best x) of the seed-mean response
    resp = []  # (x - x*, excess log tokens, above?)
    seed_dev: dict[int, list[float]] = {}
    cell_dev = []
    for L in (2.5, 2.6, 2.7, 2.8):
        by_b: dict[int, dict[int, dict[int, float]]] = {}
        for (s, b, k), c in cells.items():
            tok = real_grid.crossing(c["tokens"], c["val_loss"], L)
            if tok is not None:
                by_b.setdefault(b, {}).setdefault(k, {})[s] = math.log(tok)
        for b, ks in by_b.items():
            full = {k: v for k, v in ks.items() if len(v) == len(seeds)}
            if len(full) < 3:
                continue
            mean = {k: float(np.mean(list(v.values()))) for k, v in full.items()}
            kb = min(mean, key=mean.get)
            if kb in (min(full), max(full)):
                continue  # optimum not bracketed
            y = [mean[kb - 1], mean[kb], mean[kb + 1]] if kb - 1 in mean and kb + 1 in mean else None
            xb = kb * real_grid.LATTICE_OCTAVES + math.log2(0.003)
            if y:  # the vertex of the parabola through the three lattice points
                den = y[0] - 2 * y[1] + y[2]
                if den > 0:
                    xb += 0.5 * (y[0] - y[2]) / den * real_grid.LATTICE_OCTAVES
            rows.append((math.log2(b / 16), L - L_REF, xb))
            for k, v in mean.items():
                x = k * real_grid.LATTICE_OCTAVES + math.log2(0.003)
                if abs(x - xb) <= 2.0:
                    resp.append((x - xb, v - mean[kb]))
            if L == L_REF:
                for s, v in full[kb].items():
                    seed_dev.setdefault(s, []).append((b, v - mean[kb]))
    X = np.array([[1.0, r[0], r[1]] for r in rows])
    x0, a, m = np.linalg.lstsq(X, np.array([r[2] for r in rows]), rcond=None)[0]
    up = [(d, e) for d, e in resp if d > 0.1]
    dn = [(d, e) for d, e in resp if d < -0.1]
    k_up = sum(d * d * e for d, e in up) / sum(d**4 for d, _ in up)
    k_dn = sum(d * d * e for d, e in dn) / sum(d**4 for d, _ in dn)
    bc_ref = float(np.interp(L_REF, table["loss"], table["b_crit"]))
    effects = []
    for s, devs in seed_dev.items():
        w = np.array([b / (b + bc_ref) for b, _ in devs])
        d = np.array([v for _, v in devs])
        e = float((w * d).sum() / (w * w).sum())
        effects.append(e)
        cell_dev += list(d - e * w)
    diverged = [
        k * real_grid.LATTICE_OCTAVES + math.log2(0.003)
        for (s, b, k), c in cells.items()
        if any(v is None for v in c["val_loss"])
    ]
    return {
        "table": table,
        "x0": float(x0),
        "a": float(a),
        "m": float(m),
        "k_above": float(k_up),
        "k_below": float(k_dn),
        "sd_seed": float(np.std(effects, ddof=1)),
        "sd_cell": float(np.std(cell_dev, ddof=1)),
        "diverge_octaves": 3.0 if not diverged else 2.5,
        "seeds": len(seeds),
        "lattice_octaves": real_grid.LATTICE_OCTAVES,
        "base_lr": 0.003,
    }


class SyntheticGrid:
    """:class:`real_coverage.Grid`'s interface on the model: ``curve(seed, b, lr, m)``, deterministic per sweep."""

    def __init__(self, cal: dict[str, Any], sweep_seed: int, truth_scale: float = 1.0):
        self.cal, self.sweep_seed, self.scale = cal, sweep_seed, truth_scale
        self.interpolated, self.missing = 0, set()
        t = cal["table"]
        self._L = np.array(t["loss"])
        self._lb = np.log(np.array(t["b_crit"]) * truth_scale)
        self._ls = np.log(np.array(t["s_min"]))

    def _interp(self, y: np.ndarray, L: np.ndarray) -> np.ndarray:
        """Linear in L inside the table, extended linearly from its two end slopes outside."""
        out = np.interp(L, self._L, y)
        lo_slope = (y[1] - y[0]) / (self._L[1] - self._L[0])
        hi_slope = (y[-1] - y[-2]) / (self._L[-1] - self._L[-2])
        out = np.where(L < self._L[0], y[0] + lo_slope * (L - self._L[0]), out)
        return np.where(L > self._L[-1], y[-1] + hi_slope * (L - self._L[-1]), out)

    def b_crit(self, L: float) -> float:
        return float(np.exp(self._interp(self._lb, np.array([L]))[0]))

    def _rng(self, *key: int) -> np.random.Generator:
        return np.random.default_rng([self.sweep_seed, *key])

    def curve(self, seed: int, b: int, lr: float, m: int) -> tuple[list[float], list[float | None], str]:
        c = self.cal
        x = math.log2(lr)
        L = LOSS_GRID
        lb, ls = np.interp(L, self._L, self._lb), self._interp(self._ls, L)  # b_crit held past the table's ends
        log_t = ls + np.log1p(np.exp(lb) / b) + math.log(b * 64)
        # the optimum's drift with the loss, measured over the reference targets, held outside them
        xs = c["x0"] + c["a"] * math.log2(b / 16) + c["m"] * (np.clip(L, *DRIFT_RANGE) - L_REF)
        d = x - xs
        log_t = log_t + np.where(d > 0, c["k_above"], c["k_below"]) * d * d
        w = b / (b + math.exp(float(self._interp(self._lb, np.array([L_REF]))[0])))
        k = round(math.log2(lr / c["base_lr"]) / c["lattice_octaves"])
        log_t = (
            log_t + self._rng(seed).normal(0, c["sd_seed"]) * w + self._rng(seed, b, k + 1000).normal(0, c["sd_cell"])
        )
        log_t = np.maximum.accumulate(log_t[::-1])[::-1]  # tokens never fall as the loss falls
        tokens = [16384.0 * (i + 1) for i in range(16 * m)]
        diverges = float(np.min(d)) > c["diverge_octaves"]
        losses: list[float | None] = []
        for t in tokens:
            if diverges and t > 16384.0:
                losses.append(None)
                break
            losses.append(float(np.interp(-math.log(t), -log_t, L)))
        return tokens[: len(losses)], losses, "diverged" if diverges else "completed"


def simulate(cal: dict[str, Any], spec_path: Path, sweeps: int, vary_truth: bool, seed: int) -> dict[str, Any]:
    """``sweeps`` simulated sweeps of the spec through the product's replay; rows of (truth, interval, estimate)."""
    from sweeps.spec import load_spec

    spec = load_spec(spec_path)
    rng = np.random.default_rng(seed)
    rows: dict[float, list] = {}
    compute = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(sweeps):
            grid = SyntheticGrid(cal, seed * 100003 + i, float(np.exp(rng.uniform(-0.7, 0.7))) if vary_truth else 1.0)
            work = Path(tmp) / f"s{i}"  # its own Optuna storage
            work.mkdir()
            res = real_coverage.replay(spec, grid, [0], work)  # type: ignore[arg-type]
            compute.append(res["compute_budgets"])
            for e in res.get("targets") or []:
                t = float(e["target_loss"])
                rows.setdefault(t, []).append((grid.b_crit(t), e.get("b_crit_ci"), e.get("b_crit")))
    return {"rows": rows, "compute": float(np.mean(compute))}


def report(label: str, out: dict[str, Any]) -> None:
    allrows = [r for rs in out["rows"].values() for r in rs]
    print(f"\n== {label}")
    for t, rs in sorted(out["rows"].items()):
        sc = real_coverage._score(rs)
        print(
            f"  target {t:.4f}: coverage={sc['coverage']:.3f} ({sc['n']}) median_width_ratio={sc['median_width_ratio']:.2f} "
            f"median_log2_bias={sc['median_log2_bias']:+.3f}"
        )
    sc = real_coverage._score(allrows)
    print(
        f"  overall: coverage={sc['coverage']:.3f} ({sc['n']} sweep x target cases) "
        f"median_width_ratio={sc['median_width_ratio']:.2f} median_log2_bias={sc['median_log2_bias']:+.3f} "
        f"compute_trials={out['compute']:.2f}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", nargs="?", default="simulate", choices=["simulate", "calibrate"])
    ap.add_argument("--spec", default=str(ROOT / "sweeps" / "examples" / "shakespeare-char.yaml"))
    ap.add_argument("--sweeps", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vary-truth", action="store_true")
    ap.add_argument("--baseline-rev", default=None)
    ap.add_argument("--code-root", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--label", default="this checkout")
    args = ap.parse_args()
    if args.command == "calibrate":
        cal = calibrate(real_grid.read_grid())
        CALIBRATION.write_text(json.dumps(cal, indent=1))
        print(json.dumps({k: v for k, v in cal.items() if k != "table"}, indent=1))
        print(f"wrote {CALIBRATION}")
        return
    cal = json.loads(CALIBRATION.read_text())
    report(args.label, simulate(cal, Path(args.spec), args.sweeps, args.vary_truth, args.seed))
    if args.baseline_rev:
        with tempfile.TemporaryDirectory() as tmp:
            wt = Path(tmp) / "baseline"
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(wt), args.baseline_rev],
                check=True,
                capture_output=True,
            )
            try:
                spec = wt / Path(args.spec).resolve().relative_to(ROOT)
                subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--code-root",
                        str(wt),
                        "--spec",
                        str(spec),
                        "--sweeps",
                        str(args.sweeps),
                        "--seed",
                        str(args.seed),
                        "--label",
                        f"revision {args.baseline_rev}",
                    ]
                    + (["--vary-truth"] if args.vary_truth else []),
                    check=True,
                )
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(wt)], check=False)


if __name__ == "__main__":
    main()
