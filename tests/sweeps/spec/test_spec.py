import copy

import pytest
import yaml
from typer.testing import CliRunner

from critbatch.main import app
from sweeps.spec import SpecError, load_spec, parse_spec
from tests.conftest import ROOT, write_spec

EXAMPLES = sorted((ROOT / "sweeps" / "examples").glob("*.yaml"))


@pytest.fixture
def tiny_checkpoint(repo_root):
    """The fine-tuning example's checkpoint (`critbatch init-checkpoint out/tiny-checkpoint ...`)."""
    from workloads.api import init_checkpoint

    ck = ROOT / "out" / "tiny-checkpoint"
    if not (ck / "config.json").is_file():
        init_checkpoint(str(ck), 64, 2, 4, 1024)
    return ck


@pytest.fixture
def wikitext_shards(repo_root):
    """The WikiText example's shards, as its header prepares them (a no-op when up to date)."""
    from workloads.api import prepare_data

    wiki = ROOT / "data" / "wikitext-2-raw"
    return prepare_data(
        [str(wiki / "wiki.test.raw")],
        ROOT / "out" / "wikitext-2-bpe",
        tokenizer=str(wiki / "bpe-2048"),
        text_documents="line",
        num_proc=1,
    ).folder


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate(path, repo_root, tiny_checkpoint, wikitext_shards):
    r = CliRunner().invoke(app, ["validate", str(path)])
    assert r.exit_code == 0, r.output
    assert "ok:" in r.output
    assert "warmup" not in r.output  # every example ramps the LR over at least 4 steps of its largest batch


def test_main_example_sweeps_4_to_128():
    # the reference grid puts b_crit near 11 (docs/benchmarks.md, "Real-training coverage"): 128 is
    # over ten times past it, and 256 only cost trials (the 4-256 variant covers less, same width)
    s = load_spec(ROOT / "sweeps" / "examples" / "shakespeare-char.yaml")
    assert s.search.batch_sizes_sequences[0] == 4 and s.search.batch_sizes_sequences[-1] == 128
    assert set(s.search.lr_rules) == {"linear", "sqrt", "none"}


def _errors(d) -> dict[str, str]:
    with pytest.raises(SpecError) as ei:
        parse_spec(d)
    return dict(ei.value.errors)


def test_every_invalid_field_is_named_by_path(tiny_spec_dict):
    d = copy.deepcopy(tiny_spec_dict)
    d["search"]["batch_sizes_sequences"] = [4, -8, 16]
    d["search"]["lr_rules"] = ["sqrt", "cubic"]
    d["model"]["d_model"] = 0
    d["unknown_field"] = 1
    errs = _errors(d)
    assert "search.batch_sizes_sequences.1" in errs
    assert "search.lr_rules.1" in errs
    assert "model.d_model" in errs
    assert "unknown_field" in errs


@pytest.mark.parametrize(
    "mutate,path",
    [
        (lambda d: d["search"]["beta2"].update(values=[0.9]), "search.beta2"),
        (lambda d: d["search"].update(lr_multiplier=[2.0, 1.0]), "search"),
        (lambda d: d.update(budget_tokens=100), "<root>"),
        (lambda d: d.update(name="bad name!"), "name"),
        (lambda d: d.pop("data"), "data"),
        (lambda d: d["model"].update(n_heads=3), "model"),
        (lambda d: d["resources"].update(workers_per_trial=3), "<root>"),
    ],
)
def test_cross_field_errors(tiny_spec_dict, mutate, path):
    d = copy.deepcopy(tiny_spec_dict)
    mutate(d)
    assert path in _errors(d)


def test_warmup_min_steps_defaults_to_4_and_is_bounded(tiny_spec_dict):
    assert parse_spec(tiny_spec_dict).schedule.warmup_min_steps == 4
    for bad in (-1, 10001, 2.5):
        d = copy.deepcopy(tiny_spec_dict)
        d["schedule"]["warmup_min_steps"] = bad
        assert "schedule.warmup_min_steps" in _errors(d)
    d = copy.deepcopy(tiny_spec_dict)
    d["schedule"]["warmup_min_steps"] = 0
    assert parse_spec(d).schedule.warmup_min_steps == 0


def test_trial_config_carries_warmup_min_steps(tiny_spec_dict):
    from sweeps.launch.trainable import trial_config

    d = copy.deepcopy(tiny_spec_dict)
    d["schedule"]["warmup_min_steps"] = 7
    hp = {
        "batch_size_sequences": 8,
        "seed": 0,
        "lr": 1e-3,
        "lr_rule": "sqrt",
        "beta2": 0.99,
        "beta2_half_life_tokens": 4096.0,
    }
    c = trial_config(parse_spec(d), hp, "t0", data_path="x")
    assert (c.schedule.warmup_tokens, c.schedule.warmup_min_steps) == (1024, 7)


def test_a_re_run_trial_config_carries_its_own_budget_and_stop_loss(tiny_spec_dict):
    """Token reallocation: the searcher's ``budget_tokens`` and ``stop_at_loss`` reach the workload's config,
    the milestones going on at the spec's spacing; without them a trial is the spec's."""
    from sweeps.launch.trainable import trial_config

    spec = parse_spec(copy.deepcopy(tiny_spec_dict))  # 8192 tokens, 4 milestones
    hp = {
        "batch_size_sequences": 8,
        "seed": 0,
        "lr": 1e-3,
        "lr_rule": "sqrt",
        "beta2": 0.99,
        "beta2_half_life_tokens": 4096.0,
    }
    plain = trial_config(spec, hp, "t0", data_path="x")
    assert plain.budget_tokens == 8192 and plain.eval.milestones_tokens == (2048, 4096, 6144, 8192)
    assert plain.eval.stop_at_loss is None
    rerun = trial_config(spec, {**hp, "budget_tokens": 3 * 8192, "stop_at_loss": 2.5}, "t1", data_path="x")
    assert rerun.budget_tokens == 24576 and rerun.eval.stop_at_loss == 2.5
    assert rerun.eval.milestones_tokens == tuple(2048 * i for i in range(1, 13))


def test_cli_validate_warns_about_a_warmup_shorter_than_4_steps_and_exits_0(tmp_path, tiny_spec_dict):
    d = copy.deepcopy(tiny_spec_dict)
    # largest batch 16 x 32 = 512 tokens per step; warmup_tokens 1024 = 2 steps once the step floor is lowered
    d["schedule"]["warmup_min_steps"] = 1
    r = CliRunner().invoke(app, ["validate", str(write_spec(tmp_path, d))])
    assert r.exit_code == 0, r.output
    assert "ok:" in r.output
    assert "warning: schedule: the LR warmup (1024 tokens) covers 2 optimizer step(s)" in r.output
    assert "schedule.warmup_min_steps >= 4" in r.output
    d["schedule"]["warmup_min_steps"] = 4
    r = CliRunner().invoke(app, ["validate", str(write_spec(tmp_path, d))])
    assert r.exit_code == 0 and "warning: schedule" not in r.output, r.output


def test_cli_validate_bad_spec_exits_2_with_paths(tmp_path, tiny_spec_dict):
    d = copy.deepcopy(tiny_spec_dict)
    d["search"]["batch_sizes_sequences"] = "many"
    d["eval"]["milestones"] = 1
    p = write_spec(tmp_path, d)
    r = CliRunner().invoke(app, ["validate", str(p)])
    assert r.exit_code == 2
    assert "search.batch_sizes_sequences" in r.output and "eval.milestones" in r.output


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "name: [unclosed\n", "42"])
def test_cli_validate_not_a_mapping_exits_2(tmp_path, text):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    r = CliRunner().invoke(app, ["validate", str(p)])
    assert r.exit_code == 2
    assert "error" in r.output


def test_cli_validate_missing_data_file_exits_2(tmp_path, tiny_spec_dict):
    d = copy.deepcopy(tiny_spec_dict)
    d["data"]["path"] = str(tmp_path / "missing.txt")
    r = CliRunner().invoke(app, ["validate", str(write_spec(tmp_path, d))])
    assert r.exit_code == 2 and "data.path" in r.output


def test_cli_validate_corpus_too_small_exits_2(tmp_path, tiny_spec_dict):
    small = tmp_path / "small.txt"
    small.write_text("hello world")
    d = copy.deepcopy(tiny_spec_dict)
    d["data"]["path"] = str(small)
    r = CliRunner().invoke(app, ["validate", str(write_spec(tmp_path, d))])
    assert r.exit_code == 2 and "too small" in r.output


def test_cli_validate_missing_checkpoint_exits_2(tmp_path, repo_root):
    d = yaml.safe_load((ROOT / "sweeps" / "examples" / "gsm8k-finetune.yaml").read_text())
    d["finetune"]["checkpoint_dir"] = str(tmp_path / "no-such-checkpoint")
    d["data"]["path"] = str(ROOT / d["data"]["path"])
    r = CliRunner().invoke(app, ["validate", str(write_spec(tmp_path, d))])
    assert r.exit_code == 2 and "checkpoint" in r.output
    assert isinstance(r.exception, SystemExit) and r.exception.code == 2  # a clean exit, not a traceback


def test_cli_run_bad_spec_starts_nothing(tmp_path, tiny_spec_dict):
    d = copy.deepcopy(tiny_spec_dict)
    d["search"]["base_lr"] = -1
    out = tmp_path / "out"
    r = CliRunner().invoke(
        app,
        [
            "run",
            str(write_spec(tmp_path, d)),
            "--output",
            str(out),
            "--tracking-uri",
            f"sqlite:///{tmp_path / 'ml.db'}",
        ],
    )
    assert r.exit_code == 2 and "search.base_lr" in r.output
    assert not out.exists() and not (tmp_path / "ml.db").exists()


def test_spec_round_trips_through_yaml(tiny_spec_dict):
    s = parse_spec(tiny_spec_dict)
    again = parse_spec(yaml.safe_load(yaml.safe_dump(s.model_dump(mode="json"))))
    assert again == s
    assert s.n_trials == 3
    assert s.milestones_tokens()[-1] == s.budget_tokens


def test_spec_derived_from_a_base(tmp_path, tiny_spec_dict):
    write_spec(tmp_path, tiny_spec_dict, "base.yaml")
    (tmp_path / "child.yaml").write_text(
        "base: base.yaml\nname: child\nseeds: [0, 1]\nsearch:\n  trials_per_batch_size: 2\n"
    )
    s = load_spec(tmp_path / "child.yaml")
    assert s.name == "child" and s.seeds == [0, 1] and s.search.trials_per_batch_size == 2
    assert s.search.batch_sizes_sequences == [4, 8, 16]  # inherited, deep-merged
    (tmp_path / "loop.yaml").write_text("base: loop.yaml\n")
    with pytest.raises(SpecError, match="circular"):
        load_spec(tmp_path / "loop.yaml")
    (tmp_path / "missing.yaml").write_text("base: nope.yaml\n")
    with pytest.raises(SpecError, match="not found"):
        load_spec(tmp_path / "missing.yaml")


def test_a_pickled_spec_outlives_a_move_of_its_sections():
    """Tune pickles the spec inside its state: it is pickled as its JSON dump (no section's class path in
    the bytes). The paths older versions wrote are read by ``sweeps.store.migrations``
    (``tests/sweeps/run/test_migrations.py``)."""
    import pickle

    import cloudpickle

    from sweeps.spec.loading import load_spec

    spec = load_spec("sweeps/examples/shakespeare-sync.yaml")
    for s in [spec, *(arm for _, arm in spec.arm_specs())]:
        blob = pickle.dumps(s)
        assert pickle.loads(blob) == s and cloudpickle.loads(cloudpickle.dumps(s)) == s
        assert b"sweeps.spec.sections" not in blob and b"TrackingSpec" not in blob


def test_transfer_refuses_a_base_batch_size_that_is_not_swept(tmp_path, tiny_spec_dict):
    """search.strategy transfer starts at the base batch size (base_lr holds there) and carries the LR outward:
    a base outside batch_sizes_sequences was accepted and silently started at the nearest swept size."""
    d = copy.deepcopy(tiny_spec_dict)
    d["search"]["base_batch_size_sequences"] = 32  # swept: 4, 8, 16
    errs = _errors(d)
    assert list(errs) == ["search"], errs
    assert "base_batch_size_sequences: 32 is not one of batch_sizes_sequences [4, 8, 16]" in errs["search"]
    assert "search.strategy independent" in errs["search"]
    r = CliRunner().invoke(app, ["validate", str(write_spec(tmp_path, d))])
    assert r.exit_code == 2 and "base_batch_size_sequences: 32 is not one of batch_sizes_sequences" in r.output, (
        r.output
    )
    d["search"]["strategy"] = "independent"  # each study scales base_lr from 32 by its rule: nothing starts there
    assert parse_spec(d).search.base_batch_size_sequences == 32
