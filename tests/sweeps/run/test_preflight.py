import copy
import json

import pytest

from sweeps.errors import InvalidInput
from sweeps.launch.cluster import plan_resources
from sweeps.run.preflight import check_output_folder, spec_warnings
from sweeps.spec import parse_spec


def spec(d, **res):
    d = copy.deepcopy(d)
    d["resources"] = {**d.get("resources", {}), **res}
    return parse_spec(d)


def test_concurrency_lowered_with_warning_when_it_does_not_fit(tiny_spec_dict):
    s = spec(tiny_spec_dict, max_concurrent_trials=4, cpus_per_worker=1, trial_driver_cpus=0.01)
    plan = plan_resources(s, {"CPU": 3.0}, {"CPU": 3.0})
    assert plan.concurrency == 2 and "running 2 at a time" in plan.warning
    assert plan.bundle_cpus == pytest.approx(1.01)


def test_fits_exactly_without_warning(tiny_spec_dict):
    s = spec(tiny_spec_dict, max_concurrent_trials=2)
    plan = plan_resources(s, {"CPU": 3.0}, {"CPU": 3.0})
    assert plan.concurrency == 2 and plan.warning is None


def test_worker_larger_than_any_node_is_refused_with_numbers(tiny_spec_dict):
    s = spec(tiny_spec_dict, cpus_per_worker=8)
    with pytest.raises(InvalidInput, match="one worker needs 8 CPU.*largest node has 4 CPU"):
        plan_resources(s, {"CPU": 16.0}, {"CPU": 4.0})


def test_trial_larger_than_cluster_is_refused(tiny_spec_dict):
    d = copy.deepcopy(tiny_spec_dict)
    d["search"]["batch_sizes_sequences"] = [4, 8, 16]
    s = spec(d, workers_per_trial=4, cpus_per_worker=1)
    with pytest.raises(InvalidInput, match="one trial needs 4.01 CPU"):
        plan_resources(s, {"CPU": 3.0}, {"CPU": 3.0})


def test_gpu_trials_need_gpus(tiny_spec_dict):
    s = spec(tiny_spec_dict, gpus_per_worker=1)
    with pytest.raises(InvalidInput, match="GPU"):
        plan_resources(s, {"CPU": 8.0}, {"CPU": 8.0})
    plan = plan_resources(s, {"CPU": 8.0, "GPU": 1.0}, {"CPU": 8.0, "GPU": 1.0})
    assert plan.concurrency == 1


def test_output_folder_rules(tmp_path):
    check_output_folder(tmp_path / "new")  # a new folder is fine
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "sweep.json").write_text(json.dumps({"sweep_id": "abc"}))
    with pytest.raises(InvalidInput, match="already holds sweep 'abc'"):
        check_output_folder(tmp_path / "old")
    check_output_folder(tmp_path / "old", resuming=True)
    with pytest.raises(InvalidInput, match="no sweep to resume"):
        check_output_folder(tmp_path / "new", resuming=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidInput, match="not a folder"):
        check_output_folder(tmp_path / "file")


@pytest.mark.parametrize(
    "schedule,batch_warmup,warned",
    [
        ({"warmup_tokens": 1024}, None, False),  # default 4 steps floor: 2048 tokens
        ({"warmup_tokens": 1024, "warmup_min_steps": 0}, None, True),  # 2 steps of 16 x 32
        ({"warmup_tokens": 2048, "warmup_min_steps": 0}, None, False),  # exactly 4 steps
        ({"warmup_tokens": 0, "warmup_min_steps": 3}, None, True),
        # with batch warmup the ramp runs at the largest trial's first batch, 16 / 4 = 4 sequences (128 tokens)
        ({"warmup_tokens": 512, "warmup_min_steps": 0}, {"schedule": [[0, 1], [2048, 4]]}, False),
    ],
)
def test_spec_warnings_for_a_warmup_of_fewer_than_4_steps_of_the_largest_batch(
    tiny_spec_dict, schedule, batch_warmup, warned
):
    d = copy.deepcopy(tiny_spec_dict)
    d["schedule"] = {**d["schedule"], **schedule}
    if batch_warmup:
        d["batch_warmup"] = batch_warmup
    warnings = [w for w in spec_warnings(parse_spec(d)) if w.startswith("schedule:")]
    assert len(warnings) == int(warned)
    if warned:
        assert (
            "schedule.warmup_min_steps >= 4" in warnings[0]
            and "largest batch (16 sequences x 32 tokens)" in warnings[0]
        )


# ---- a locked Optuna storage ---------------------------------------------------------------------


@pytest.fixture
def locked_sqlite(tmp_path):
    """A SQLite file held by another process in an exclusive transaction until the test ends."""
    import subprocess
    import sys

    from tests.harness import wait_for

    db, marker = tmp_path / "optuna.db", tmp_path / "locked"
    code = (
        "import sqlite3, sys, time, pathlib; c = sqlite3.connect(sys.argv[1]); "
        "c.execute('create table if not exists t (x)'); c.commit(); c.execute('BEGIN EXCLUSIVE'); "
        "pathlib.Path(sys.argv[2]).touch(); time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(db), str(marker)])
    try:
        wait_for(marker.exists, 30, "the lock holder")
        yield db
    finally:
        holder.kill()
        holder.wait()


def test_a_locked_optuna_storage_is_refused_naming_the_file(locked_sqlite):
    from sweeps.errors import InvalidInput
    from sweeps.run.preflight import check_optuna_storage

    with pytest.raises(
        InvalidInput,
        match=r"CRITBATCH_OPTUNA_STORAGE: the Optuna study storage .*optuna.db cannot be "
        r"written \(database is locked; waited 0.2 s\)",
    ):
        check_optuna_storage(f"sqlite:///{locked_sqlite}", source="CRITBATCH_OPTUNA_STORAGE", wait_s=0.2)


def test_a_free_or_missing_optuna_storage_passes_and_is_not_written(tmp_path):
    import sqlite3

    from sweeps.run.preflight import check_optuna_storage

    check_optuna_storage(f"sqlite:///{tmp_path / 'absent.db'}", source="x")
    assert not (tmp_path / "absent.db").exists()
    db = tmp_path / "free.db"
    with sqlite3.connect(db) as c:
        c.execute("create table t (x)")
    before = db.read_bytes()
    check_optuna_storage(f"sqlite:///{db}", source="x")
    assert db.read_bytes() == before
    check_optuna_storage("postgresql://u@127.0.0.1:9/optuna", source="x")  # not checked: left to Optuna


def test_run_with_a_locked_shared_optuna_storage_exits_2_before_anything_starts(
    tmp_path, tiny_spec_dict, locked_sqlite
):
    from tests.conftest import invoke_cli, write_spec

    out = tmp_path / "out"
    r = invoke_cli(
        [
            "run",
            str(write_spec(tmp_path, tiny_spec_dict)),
            "--output",
            str(out),
            "--no-progress",
            "--tracking-uri",
            f"sqlite:///{tmp_path / 'ml.db'}",
            "--address",
            "127.0.0.1:9",
        ],
        env={"CRITBATCH_OPTUNA_STORAGE": f"sqlite:///{locked_sqlite}"},
    )
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "optuna.db cannot be written" in lines[0] and "database is locked" in lines[0], r.stderr
    assert not out.exists() and not (tmp_path / "ml.db").exists()


# ---- batch sizes whose steps pass several milestones ---------------------------------------------


def test_reported_milestones_fold_the_milestones_one_step_passes():
    from sweeps.spec.milestones import reported_milestones

    assert reported_milestones([4096, 8192, 12288, 16384], 128) == [4096, 8192, 12288, 16384]
    assert reported_milestones([4096, 8192, 12288, 16384], 8192) == [8192, 16384]  # B=256 of 32 tokens
    assert reported_milestones([1000, 2000, 3000], 768) == [1536, 2304, 3072]  # at the tokens actually seen


def test_a_batch_size_that_skips_milestones_is_refused_by_validate_and_run(tmp_path, tiny_spec_dict):
    """B = 256 of 32 tokens steps 8192 tokens, twice the milestone spacing, and would report
    at 2 of the 4 milestones: validate and run refuse it (exit 2, the numbers named, nothing created)."""
    from sweeps.spec import parse_spec
    from sweeps.spec.milestones import milestone_warnings
    from tests.conftest import invoke_cli, write_spec

    d = dict(tiny_spec_dict, budget_tokens=16384, eval={"milestones": 4, "eval_tokens": 1024})
    d["search"] = dict(d["search"], batch_sizes_sequences=[4, 256], base_batch_size_sequences=4)
    (w,) = milestone_warnings(parse_spec(d))
    assert (
        "batch size 256 (8192 tokens per optimizer step) reports at 2 of the 4 milestones (at 8192, 16384 tokens)" in w
    )
    assert "milestone spacing (4096 tokens)" in w
    path = write_spec(tmp_path, d)
    r = invoke_cli(["validate", str(path)])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "batch size 256 (8192 tokens per optimizer step) reports at 2 of the 4 milestones" in r.stderr
    assert "eval.milestones <= 2" in r.stderr and "eval.allow_folded_milestones: true" in r.stderr
    out = tmp_path / "out"
    r = invoke_cli(
        [
            "run",
            str(path),
            "--output",
            str(out),
            "--tracking-uri",
            f"sqlite:///{tmp_path / 'ml.db'}",
            "--address",
            "127.0.0.1:9",
            "--no-progress",
        ]
    )
    assert r.returncode == 2 and "reports at 2 of the 4 milestones" in r.stderr, r.stdout + r.stderr
    assert not out.exists() and not (tmp_path / "ml.db").exists()
    assert milestone_warnings(parse_spec(tiny_spec_dict)) == []  # 16 x 32 = 512 tokens per step, spacing 2048


def test_folded_milestones_are_accepted_with_the_opt_in_and_still_named(tmp_path, tiny_spec_dict):
    from sweeps.spec import parse_spec
    from tests.conftest import invoke_cli, write_spec

    d = dict(
        tiny_spec_dict,
        budget_tokens=16384,
        eval={"milestones": 4, "eval_tokens": 1024, "allow_folded_milestones": True},
    )
    d["search"] = dict(d["search"], batch_sizes_sequences=[4, 256], base_batch_size_sequences=4)
    r = invoke_cli(["validate", str(write_spec(tmp_path, d))])
    assert r.returncode == 0, r.stdout + r.stderr
    assert (
        "warning: search.batch_sizes_sequences: batch size 256 (8192 tokens per optimizer step) reports at 2"
        in r.stdout + r.stderr
    )
    # the opt-in is part of the spec (and its fingerprint) only when set: older specs keep their sweep ids
    plain = parse_spec(tiny_spec_dict)
    assert "allow_folded_milestones" not in plain.model_dump()["eval"]
    assert parse_spec(d).model_dump()["eval"]["allow_folded_milestones"] is True


def test_the_main_job_and_every_example_keep_one_report_per_milestone():
    """The main job's milestones are what they were (16 of 16384 tokens = B 256 x 64 tokens: every swept batch
    size's step lands on each), and no example spec folds milestones."""
    from pathlib import Path

    from sweeps.spec import load_spec
    from sweeps.spec.milestones import check_milestones, reported_milestones

    root = Path(__file__).resolve().parents[3]
    main = load_spec(root / "sweeps" / "examples" / "shakespeare-char.yaml")
    assert main.milestones_tokens() == [16384 * (i + 1) for i in range(16)]
    for b in main.search.batch_sizes_sequences:
        assert reported_milestones(main.milestones_tokens(), b * 64) == main.milestones_tokens()
    for path in sorted((root / "sweeps" / "examples").glob("*.yaml")):
        s = load_spec(path)
        for one in [arm for _, arm in s.arm_specs()] if s.arms else [s]:
            check_milestones(one)  # raises for a folded one


def test_a_sweep_of_fewer_than_3_batch_sizes_is_told_no_b_crit_will_come_out(tmp_path, tiny_spec_dict):
    from sweeps.run.preflight import spec_warnings
    from sweeps.spec import parse_spec
    from tests.conftest import invoke_cli, write_spec

    d = dict(tiny_spec_dict, search=dict(tiny_spec_dict["search"], batch_sizes_sequences=[4, 8]))
    (w,) = [x for x in spec_warnings(parse_spec(d)) if x.startswith("search.batch_sizes_sequences")]
    assert "2 batch sizes cannot give b_crit" in w and "needs at least 3" in w and "no b_crit" in w
    r = invoke_cli(["validate", str(write_spec(tmp_path, d))])
    assert (
        r.returncode == 0
        and "warning: search.batch_sizes_sequences: 2 batch sizes cannot give b_crit" in r.stdout + r.stderr
    )
    assert not [x for x in spec_warnings(parse_spec(tiny_spec_dict)) if "cannot give b_crit" in x]  # 3: a fit


def test_a_sweep_of_3_batch_sizes_is_told_ok_is_out_of_reach(tiny_spec_dict):
    """3 batch sizes give a fit, but status ok needs 2 fitted batch sizes on each side of the knee: a
    newcomer's 3-batch-size spec validated without a word, and could only ever end edge."""
    from sweeps.run.preflight import spec_warnings
    from sweeps.spec import parse_spec

    assert len(tiny_spec_dict["search"]["batch_sizes_sequences"]) == 3
    (w,) = [x for x in spec_warnings(parse_spec(tiny_spec_dict)) if x.startswith("search.batch_sizes_sequences")]
    assert "3 batch sizes can give b_crit but never status ok" in w and "edge at best" in w
    d = dict(tiny_spec_dict, search=dict(tiny_spec_dict["search"], batch_sizes_sequences=[4, 8, 16, 32]))
    assert not [x for x in spec_warnings(parse_spec(d)) if x.startswith("search.batch_sizes_sequences")]


# ---- one batch larger than the corpus's training windows -----------------------------------------


def test_a_batch_larger_than_the_corpus_training_windows_is_named_by_validate(tmp_path, tiny_spec_dict):
    """3000 bytes, 10 % held out: 2700 training tokens hold 84 non-overlapping windows of 32; B = 128 and
    256 draw more per step, so windows overlap or repeat within one batch. Counted from the file the
    preflight already reads, nothing prepared."""
    from tests.conftest import invoke_cli, write_spec

    corpus = tmp_path / "small.txt"
    corpus.write_text(("To be, or not to be, that is the question.\n" * 80)[:3000])
    d = dict(
        tiny_spec_dict, budget_tokens=16384, eval={"milestones": 2, "eval_tokens": 256}, data={"path": str(corpus)}
    )
    d["search"] = dict(d["search"], batch_sizes_sequences=[4, 8, 128, 256])
    r = invoke_cli(["validate", str(write_spec(tmp_path, d))])
    assert r.returncode == 0, r.stdout + r.stderr
    assert (
        "warning: search.batch_sizes_sequences: batch sizes 128, 256 draw more sequences per optimizer step than "
        "the corpus holds non-overlapping training windows of 32 tokens (2700 training tokens) (84)"
    ) in r.stdout + r.stderr
    assert "batch sizes <= 84" in r.stdout + r.stderr
    d["search"] = dict(d["search"], batch_sizes_sequences=[4, 8, 64])
    r = invoke_cli(["validate", str(write_spec(tmp_path, d))])
    assert r.returncode == 0 and "windows overlap" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_window_warnings_count_rows_of_a_finetuning_set_and_say_when_they_could_not_count(tiny_spec_dict):
    from sweeps.run.preflight import window_warnings

    s = spec(tiny_spec_dict)  # batch sizes 4, 8, 16
    (w,) = window_warnings(s, {"train_rows": 10})
    assert "batch size 16 draws more sequences per optimizer step than the corpus holds training rows (10)" in w
    assert window_warnings(s, {"train_tokens": 16 * 32 + 1}) == []  # 16 windows of 32: B = 16 fits exactly
    (w,) = window_warnings(s, {"train_tokens": 16 * 32})
    assert "(15)" in w
    (w,) = window_warnings(s, None)
    assert "could not be checked" in w


def test_a_budget_that_a_batch_sizes_step_does_not_divide_is_named(tiny_spec_dict):
    """The loop stops after the first step at or past budget_tokens: B = 12 of 32 tokens (384 per step) trains
    8448 tokens of a budget of 8192, 3.1 % more than the others."""
    from sweeps.run.preflight import budget_warnings

    s = spec(dict(tiny_spec_dict, search=dict(tiny_spec_dict["search"], batch_sizes_sequences=[4, 8, 12, 16])))
    (w,) = budget_warnings(s)
    assert w.startswith("budget_tokens: batch size 12 trains 8448 tokens (3.1% more), not 8192")
    assert "use a multiple of 1536 tokens" in w
    assert budget_warnings(spec(tiny_spec_dict)) == []
    assert [x for x in spec_warnings(s) if x.startswith("budget_tokens:")] == [w]
