"""``cbs.json``'s record (:class:`sweeps.spec.result.CbsResult`): the file the current code writes re-serializes to
the same bytes, files of earlier versions load, and the sweep's additions go through one builder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweeps.analysis import CbsResult, finite_json, finite_result, with_sweep_fields
from sweeps.spec.result import (
    BestCheckpoint,
    ComparisonResult,
    LocalCbsPoint,
    MlflowRuns,
    TargetFit,
    is_comparison_record,
)

FIXTURES = Path(__file__).parent / "fixtures"


def _written(result: CbsResult) -> str:
    """``cbs.json``'s text as :func:`sweeps.run.finish.finish_sweep` writes it (indented JSON)."""
    return json.dumps(result.to_json_dict(), indent=2)


def test_a_fitted_sweeps_cbs_json_reserializes_to_the_same_bytes():
    text = (FIXTURES / "shakespeare_cbs.json").read_text()
    result = CbsResult.model_validate(json.loads(text))
    assert _written(result) == text
    assert list(json.loads(text))[0] == "headline"  # the file opens with the answer


def test_the_record_reads_through_attributes():
    result = CbsResult.model_validate_json((FIXTURES / "shakespeare_cbs.json").read_text())
    assert result.fitted and result.b_crit == pytest.approx(12.370567521781771)
    assert isinstance(result.targets[0], TargetFit) and result.targets[0].points[0].batch_size_sequences > 0
    assert isinstance(result.mlflow, MlflowRuns) and isinstance(result.best_checkpoint, BestCheckpoint)
    assert result.trials.COMPLETED == 25 and result.per_batch[0].best_config_at_budget["lr_rule"]
    assert result.target(result.target_loss) is not None and result.target(-1.0) is None


def test_a_failed_sweeps_cbs_json_keeps_its_keys_and_values():
    """A sweep with nothing to fit: every key and value kept, null where the file has null (in the record's order)."""
    raw = json.loads((FIXTURES / "no_fit_cbs.json").read_text())
    out = CbsResult.model_validate(raw).to_json_dict()
    assert out == raw and list(out)[0] == "headline"
    assert out["b_crit"] is None and "b_crit_ci_tokens" not in out


def test_a_cbs_json_of_an_earlier_version_loads_with_its_extra_keys():
    raw = json.loads((FIXTURES / "wikitext_cbs.json").read_text())
    result = CbsResult.model_validate(raw)
    assert result.headline is None and result.b_crit == pytest.approx(11.057612665468445)
    assert result.to_json_dict() == raw  # "_provenance", a key of older files, is kept
    assert "headline" not in result and result["_provenance"] == raw["_provenance"]


def test_the_sweeps_additions_take_their_place_whatever_the_order_given():
    text = (FIXTURES / "shakespeare_cbs.json").read_text()
    full = json.loads(text)
    added = (
        "sweep_id",
        "flops_per_token",
        "trials_planned",
        "optimizer",
        "provenance",
        "mlflow",
        "precision",
        "best_checkpoint",
    )
    base = CbsResult.model_validate({k: v for k, v in full.items() if k not in added})
    rebuilt = with_sweep_fields(base, best_checkpoint=full["best_checkpoint"], precision=full["precision"])
    rebuilt = with_sweep_fields(rebuilt, **{k: full[k] for k in reversed(added[:6])})
    assert _written(finite_result(rebuilt)) == text
    with pytest.raises(ValueError, match="not fields of cbs.json"):
        with_sweep_fields(base, b_krit=1.0)


def test_non_finite_floats_are_written_as_null():
    result = finite_result(CbsResult(b_crit=float("nan"), s_min=float("inf"), status="ok"))
    assert result.to_json_dict() == {"b_crit": None, "s_min": None, "status": "ok"}


def test_a_local_cbs_series_is_typed_and_written_as_branching_gave_it():
    """``critbatch branch`` adds ``local_cbs`` to a sweep's ``cbs.json``: integer multipliers and token counts
    stay integers in the file (``2``, not ``2.0``), a branch without a loss stays null."""
    base = CbsResult.model_validate(json.loads((FIXTURES / "shakespeare_cbs.json").read_text()))
    series = [
        {
            "tokens_seen": 4096,
            "k_star": 2,
            "local_cbs_sequences": 16,
            "losses": {"1": 2.5, "2": 2.49, "4": None},
            "tokens_seen_at_loss": {"1": 8192, "2": 8192, "4": None},
        }
    ]
    result = with_sweep_fields(base, local_cbs=series)
    (point,) = result.local_cbs or []
    assert isinstance(point, LocalCbsPoint) and point.k_star == 2 and point.losses == {"1": 2.5, "2": 2.49, "4": None}
    assert json.loads(_written(result))["local_cbs"] == series
    assert '"k_star": 2,' in _written(result) and '"local_cbs_sequences": 16,' in _written(result)


def _comparison() -> dict:
    """A comparison's ``cbs.json`` as :func:`sweeps.analysis.compare.compare_arms` and the comparison write it:
    a fitted reference arm, one arm without trials."""
    from sweeps.analysis.compare import compare_arms

    ref = CbsResult.model_validate(json.loads((FIXTURES / "shakespeare_cbs.json").read_text()))
    info = {"sync": "ddp", "sync_every_steps": 1, "replicas": 1, "optimizer": "adamw", "status": "SUCCEEDED"}
    info |= {"optimizer_state_bytes_per_param": 8, "comm_bytes_per_step": None, "sweep_id": "c.ref"}
    other = {**info, "sync": "local_sgd", "sync_every_steps": 4, "status": "FAILED", "sweep_id": "c.other"}
    comparison = compare_arms([("ref", info, ref), ("other", other, None)])
    return {**comparison, "comparison_id": "c", "name": "n", "arm_outputs": {"ref": "/o/ref", "other": "/o/other"}}


def test_a_comparisons_cbs_json_reserializes_to_the_same_bytes_and_reads_through_attributes():
    raw = json.loads(json.dumps(finite_json(_comparison())))
    record = ComparisonResult.model_validate(raw)
    assert json.dumps(finite_json(record), indent=2) == json.dumps(raw, indent=2)
    assert is_comparison_record(raw) and is_comparison_record(record) and not is_comparison_record({"b_crit": 1.0})
    ref, other = record.arms
    i = record.primary_index()
    assert record.targets[i] == record.target_loss and ref.targets[i].b_crit == raw["arms"][0]["targets"][i]["b_crit"]
    assert (
        ref.targets[0].points and ref.targets[0].points[0].syncs_to_target == ref.targets[0].points[0].steps_to_target
    )
    assert [t.status for t in other.targets] == ["not_analysed"] * len(record.targets)
    assert record.by_target[0].arms["other"].b_crit is None and ref.optimizer_state_bytes_per_param == 8
