"""A comparison spec (``arms``) and ``tracking.tags``: derived arm specs, refusals, dumps."""

import copy

import pytest
from typer.testing import CliRunner

from critbatch.main import app
from sweeps.spec import SpecError, parse_spec
from tests.conftest import write_spec


def _arms(d: dict, *arms: dict) -> dict:
    d = copy.deepcopy(d)
    d["arms"] = list(arms)
    return d


def test_no_arms_and_no_tags_leave_the_dump_and_fingerprint_as_before(tiny_spec_dict):
    s = parse_spec(tiny_spec_dict)
    dumped = s.model_dump()
    assert "arms" not in dumped and "tags" not in dumped["tracking"]
    assert s.arm_specs() == []
    tagged = parse_spec({**tiny_spec_dict, "tracking": {"tags": {"team": "infra"}}})
    assert tagged.fingerprint() != s.fingerprint() and tagged.tracking.tags == {"team": "infra"}


def test_each_arm_is_the_spec_with_its_overrides_in_the_comparisons_experiment(tiny_spec_dict):
    s = parse_spec(
        _arms(
            tiny_spec_dict,
            {"name": "base"},
            {"name": "wide", "model": {"d_model": 64}, "search": {"batch_sizes_sequences": [8, 16]}},
        )
    )
    (n0, a0), (n1, a1) = s.arm_specs()
    assert (n0, n1) == ("base", "wide")
    assert (a0.name, a1.name) == ("tiny.base", "tiny.wide")
    assert a0.experiment_name == a1.experiment_name == "tiny"
    assert a1.tracking.tags == {"critbatch.comparison": "tiny", "critbatch.arm": "wide"}
    assert a0.model.d_model == 32 and a1.model.d_model == 64  # a mapping merges: the rest of model is kept
    assert a1.model.n_layers == a0.model.n_layers
    assert a0.search.batch_sizes_sequences == [4, 8, 16] and a1.search.batch_sizes_sequences == [8, 16]  # lists replace
    assert a0.arms == [] and a0.fingerprint() != a1.fingerprint()
    # the dump is flat (as written) and round-trips
    assert s.model_dump(mode="json")["arms"][1] == {
        "name": "wide",
        "model": {"d_model": 64},
        "search": {"batch_sizes_sequences": [8, 16]},
    }
    assert parse_spec(s.model_dump(mode="json")).fingerprint() == s.fingerprint()


@pytest.mark.parametrize(
    "arms, needle",
    [
        ([{"name": "only"}], "at least 2 arms"),
        ([{"name": "a"}, {"name": "a"}], "names must be unique"),
        ([{"name": "a"}, {"name": "bad name"}], "1-24 letters"),
        ([{"name": "a"}, {"name": "b", "name_": 1}], "arms.1 (b)"),
        ([{"name": "a"}, {"name": "b", "tracking": {"uri": "sqlite:///x.db"}}], "cannot set ['tracking']"),
        (
            [{"name": "a"}, {"name": "b", "resources": {"workers_per_trial": 3}}],
            "arms.1 (b): search.batch_sizes_sequences",
        ),
        ([{"name": "a"}, {"name": "b", "model": {"d_model": -1}}], "arms.1 (b): model.d_model"),
    ],
)
def test_a_bad_arm_is_refused_naming_the_arm_and_the_field(tiny_spec_dict, arms, needle):
    with pytest.raises(SpecError) as e:
        parse_spec(_arms(tiny_spec_dict, *arms))
    assert needle in str(e.value), str(e.value)


def test_reserved_tags_are_refused(tiny_spec_dict):
    with pytest.raises(SpecError, match="sweep's own tags"):
        parse_spec({**tiny_spec_dict, "tracking": {"tags": {"critbatch.role": "trial"}}})


def test_validate_lists_the_arms_and_a_bad_arm_exits_2(tmp_path, tiny_spec_dict):
    ok = write_spec(tmp_path, _arms(tiny_spec_dict, {"name": "a"}, {"name": "b", "search": {"lr_rules": ["linear"]}}))
    r = CliRunner().invoke(app, ["validate", str(ok)])
    assert r.exit_code == 0, r.output
    assert "arm b: 3 batch sizes" in r.output and "comparison 'tiny' of 2 arms, 6 trials in all" in r.output
    bad = write_spec(tmp_path, _arms(tiny_spec_dict, {"name": "a"}, {"name": "b", "budget_tokens": 1}), "bad.yaml")
    r = CliRunner().invoke(app, ["validate", str(bad)])
    assert r.exit_code == 2 and "arms.1 (b)" in r.output, r.output


def test_an_arm_without_a_strategy_gets_the_default_for_its_own_settings(tiny_spec_dict):
    s = parse_spec(
        _arms(
            tiny_spec_dict,
            {"name": "plain"},
            {"name": "paused", "pruning": {"enabled": True}},
            {"name": "pinned", "search": {"strategy": "independent"}},
        )
    )
    arms = dict(s.arm_specs())
    assert s.search.strategy == "transfer" and arms["plain"].search.strategy == "transfer"
    assert arms["paused"].search.strategy == "independent"  # pause-mode pruning: transfer cannot run there
    assert arms["pinned"].search.strategy == "independent"
    explicit = copy.deepcopy(tiny_spec_dict)
    explicit["search"]["strategy"] = "independent"
    assert (
        dict(parse_spec(_arms(explicit, {"name": "a"}, {"name": "b"})).arm_specs())["b"].search.strategy
        == "independent"
    )


def _dense_arm(tmp_path, tiny_spec_dict):
    """A comparison whose second arm asks 32 milestones of 8192 tokens (256 apart): batch size 16 steps 512."""
    return write_spec(tmp_path, _arms(tiny_spec_dict, {"name": "a"}, {"name": "dense", "eval": {"milestones": 32}}))


def test_validate_names_the_arm_whose_milestones_are_closer_than_one_step(tmp_path, tiny_spec_dict):
    r = CliRunner().invoke(app, ["validate", str(_dense_arm(tmp_path, tiny_spec_dict))])
    assert r.exit_code == 2, r.output
    assert "arms.1 (dense): search.batch_sizes_sequences: batch size 16" in r.output, r.output


def test_validate_names_the_arm_whose_data_is_missing(tmp_path, tiny_spec_dict):
    spec = write_spec(
        tmp_path, _arms(tiny_spec_dict, {"name": "a"}, {"name": "gone", "data": {"path": str(tmp_path / "nope.txt")}})
    )
    r = CliRunner().invoke(app, ["validate", str(spec)])
    assert r.exit_code == 2, r.output
    assert "arms.1 (gone): data.path: file not found" in r.output, r.output


def test_run_refuses_the_arm_by_name_before_anything_starts(tmp_path, tiny_spec_dict, repo_root):
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["run", str(_dense_arm(tmp_path, tiny_spec_dict)), "-o", str(out), "--no-progress"])
    assert r.exit_code == 2, r.output
    assert "arms.1 (dense): search.batch_sizes_sequences: batch size 16" in r.output, r.output
    assert not out.exists()
