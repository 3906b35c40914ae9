"""The fits by name (:mod:`sweeps.analysis.fits`): the hyperbola is the one registered today, the analysis calls
the fit it is given through the registry, and a new fit is one registration away."""

from __future__ import annotations

from typing import Any

import pytest

from sweeps.analysis import (
    DEFAULT_FIT,
    Fit,
    TrialRecord,
    analyze_points,
    analyze_trials,
    fit_names,
    get_fit,
    register_fit,
)
from sweeps.analysis import fits as fits_module
from sweeps.analysis.fit import INTERVAL_METHOD
from sweeps.analysis.hyperbola import Hyperbola


def _trials() -> list[TrialRecord]:
    """One trial per batch size on S = 40 (1 + 16 / B): b_crit 16 sequences."""
    out = []
    for b in (4, 8, 16, 32, 64, 128):
        steps = 40.0 * (1 + 16.0 / b)
        tokens = [t * b * 8.0 for t in (steps / 4, steps / 2, steps, steps * 2)]
        out.append(
            TrialRecord(
                trial_id=f"t{b}",
                batch_size_sequences=b,
                seed=0,
                group_id=f"t{b}",
                status="COMPLETED",
                hyperparameters={"lr": 1e-3},
                tokens=tokens,
                val_loss=[4.0, 3.5, 3.0, 2.5],
                flops=[t * 1.0 for t in tokens],
            )
        )
    return out


def test_the_hyperbola_is_the_registered_default():
    assert DEFAULT_FIT == "hyperbola" and DEFAULT_FIT in fit_names()
    fit = get_fit("hyperbola")
    assert isinstance(fit, Hyperbola) and fit.interval_method == INTERVAL_METHOD
    b = [4.0, 8.0, 16.0, 32.0, 64.0]
    s = [40.0 * (1 + 16.0 / x) for x in b]
    assert fit.analyze(b, s, 16.0) == analyze_points(b, s, 16.0)
    assert fit.analyze(b, s, 16.0)["b_crit"] == pytest.approx(16.0, rel=1e-6)  # S_min = 40, E_min = 640


def test_an_unknown_or_repeated_name_is_refused():
    with pytest.raises(KeyError, match="unknown fit 'power'.*hyperbola"):
        get_fit("power")
    with pytest.raises(ValueError, match="registered already"):
        register_fit(Hyperbola())


def test_the_analysis_calls_the_fit_it_is_given_through_the_registry(monkeypatch):
    calls: list[int] = []

    class Flat(Fit):
        name = "flat"
        interval_method = "none: a test fit"

        def analyze(self, batch_sizes, steps, reference_batch, **kw: Any) -> dict[str, Any]:
            calls.append(len(batch_sizes))
            return {"status": "no_knee", "b_crit": None, "b_crit_ci": None, "message": "flat"}

    monkeypatch.setattr(fits_module, "_FITS", dict(fits_module._FITS))
    register_fit(Flat())
    assert fit_names() == ("hyperbola", "flat")
    res = analyze_trials(_trials(), context_length_tokens=8, reference_batch=16, targets=[3.0], fit="flat")
    assert calls and res.interval_method == "none: a test fit" and res.status == "no_knee" and res.b_crit is None
    default = analyze_trials(_trials(), context_length_tokens=8, reference_batch=16, targets=[3.0])
    assert default.interval_method == INTERVAL_METHOD


def test_critbatch_analyze_chooses_a_registered_fit_by_name_and_refuses_an_unknown_one(monkeypatch, tmp_path):
    """A fit registered from outside the product is usable from the CLI (`critbatch analyze --fit NAME`); a name
    that is not registered exits 2 naming the registered ones."""
    from typer.testing import CliRunner

    from critbatch.main import app

    class Flat(Fit):
        name = "flat"
        interval_method = "none: a test fit"

        def analyze(self, batch_sizes, steps, reference_batch, **kw: Any) -> dict[str, Any]:
            return {"status": "no_knee", "b_crit": None, "b_crit_ci": None, "message": f"flat over {len(steps)}"}

    monkeypatch.setattr(fits_module, "_FITS", dict(fits_module._FITS))
    register_fit(Flat())
    table = tmp_path / "steps.csv"
    table.write_text("batch_size,steps_to_target\n" + "".join(f"{b},{40 * (1 + 16 / b)}\n" for b in (4, 8, 16, 32)))
    r = CliRunner().invoke(app, ["analyze", "--csv", str(table), "--reference-batch", "16", "--fit", "flat"])
    assert r.exit_code == 0, r.output
    assert '"message": "flat over 4"' in r.stdout and '"status": "no_knee"' in r.stdout
    r = CliRunner().invoke(app, ["analyze", "--csv", str(table), "--reference-batch", "16", "--fit", "power"])
    assert r.exit_code == 2 and "'power' is not a registered fit: one of hyperbola, flat" in r.output
