"""What ``critbatch validate`` says about a bad spec: a missing file, a YAML error, a value
of the wrong type and an unknown field each in one line on stderr, exit 2; every field by its dotted
path, the bad value shown, a close field name suggested from the section's own fields."""

from __future__ import annotations

import copy
import pickle

import pytest
from typer.testing import CliRunner

from critbatch.main import app
from sweeps.spec import SearchSpec, SpecError, parse_spec_text
from tests.conftest import write_spec


def validate(path) -> tuple[int, list[str]]:
    """``critbatch validate PATH``: its exit code and its stderr lines (stdout must be empty)."""
    r = CliRunner().invoke(app, ["validate", str(path)])
    assert r.stdout == "", r.output
    return r.exit_code, r.stderr.splitlines()


def test_a_missing_file_is_one_line(tmp_path):
    missing = tmp_path / "nope.yaml"
    assert validate(missing) == (2, [f"error: spec file not found: {missing}"])


def test_a_missing_base_file_is_one_line_naming_it(tmp_path):
    (tmp_path / "child.yaml").write_text("base: parent.yaml\nname: child\n")
    assert validate(tmp_path / "child.yaml") == (2, [f"error: spec file not found: {tmp_path / 'parent.yaml'}"])


def test_a_folder_is_not_a_spec_file(tmp_path):
    assert validate(tmp_path) == (2, [f"error: spec file {tmp_path} is a folder, not a file"])


def test_a_yaml_error_names_the_file_line_and_column(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndata: [a\n  b: c\n")
    code, lines = validate(bad)
    assert code == 2 and lines == [
        f"error: not valid YAML in {bad} at line 3, column 4: expected ',' or ']', but got ':' "
        "(while parsing a flow sequence at line 2, column 7)"
    ], lines


def test_a_yaml_error_in_a_base_file_names_the_base(tmp_path):
    (tmp_path / "parent.yaml").write_text("name: x\n  bad: indent\n")
    (tmp_path / "child.yaml").write_text("base: parent.yaml\n")
    code, lines = validate(tmp_path / "child.yaml")
    assert code == 2 and lines == [
        f"error: not valid YAML in {tmp_path / 'parent.yaml'} at line 2, column 6: mapping values are not allowed here"
    ], lines


def test_a_control_character_is_placed_by_line_and_column(tmp_path):
    bad = tmp_path / "ctl.yaml"
    bad.write_text("name: x\nseeds: [0]\x07\n")
    code, lines = validate(bad)
    assert code == 2 and lines == [
        f"error: not valid YAML in {bad} at line 2, column 11: unacceptable character #x0007 "
        "(special characters are not allowed)"
    ], lines


def test_yaml_text_without_a_file_is_placed_too():
    with pytest.raises(SpecError) as e:
        parse_spec_text("a: [1\nb: 2\n")
    assert str(e.value).startswith("not valid YAML at line 2, column 2: ")
    assert "<unicode string>" not in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("value,shown", [("lots", "'lots'"), (True, "true"), (1.5, "1.5")])
def test_a_type_error_shows_the_value(tmp_path, tiny_spec_dict, value, shown):
    d = {**tiny_spec_dict, "budget_tokens": value}
    code, lines = validate(write_spec(tmp_path, d))
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: invalid sweep spec: budget_tokens: Input should be a valid integer")
    assert lines[0].endswith(f", got {shown}"), lines


def test_a_bad_list_element_shows_its_path_and_value(tmp_path, tiny_spec_dict):
    d = copy.deepcopy(tiny_spec_dict)
    d["search"]["lr_rules"] = ["sqrt", "cubic"]
    code, lines = validate(write_spec(tmp_path, d))
    assert (code, lines) == (
        2,
        ["error: invalid sweep spec: search.lr_rules.1: Input should be 'linear', 'sqrt' or 'none', got 'cubic'"],
    ), lines


def test_a_misspelt_required_field_is_one_error_with_a_suggestion(tmp_path, tiny_spec_dict):
    d = dict(tiny_spec_dict)
    d["budget_tokns"] = d.pop("budget_tokens")
    assert validate(write_spec(tmp_path, d)) == (
        2,
        ["error: invalid sweep spec: budget_tokns: unknown field; did you mean `budget_tokens`, which is required?"],
    )


@pytest.mark.parametrize(
    "section,typo,field",
    [
        ("search", "trials_per_batchsize", "trials_per_batch_size"),
        ("model", "nlayers", "n_layers"),
        ("schedule", "warmup_token", "warmup_tokens"),
    ],
)
def test_an_unknown_field_gets_the_closest_field_of_its_section(tmp_path, tiny_spec_dict, section, typo, field):
    d = copy.deepcopy(tiny_spec_dict)
    d[section][typo] = d[section].get(field, 1)
    d[section].pop(field, None)
    assert validate(write_spec(tmp_path, d)) == (
        2,
        [f"error: invalid sweep spec: {section}.{typo}: unknown field; did you mean `{field}`?"],
    )


def test_suggestions_follow_lists_and_optional_sections(tmp_path, tiny_spec_dict):
    d = copy.deepcopy(tiny_spec_dict)
    d["search"]["initial_points"] = [{"lr_rul": "sqrt"}]
    d["pruning"] = {"enabld": True}
    code, lines = validate(write_spec(tmp_path, d))
    assert code == 2 and lines == [
        "error: invalid sweep spec (2 errors):",
        "  search.initial_points.0.lr_rul: unknown field; did you mean `lr_rule`?",
        "  pruning.enabld: unknown field; did you mean `enabled`?",
    ], lines


def test_an_unknown_field_without_a_close_one_lists_its_section(tmp_path, tiny_spec_dict):
    d = copy.deepcopy(tiny_spec_dict)
    d["search"]["zzz"] = 1
    code, lines = validate(write_spec(tmp_path, d))
    assert (code, lines) == (
        2,
        [
            "error: invalid sweep spec: search.zzz: unknown field; search takes "
            + ", ".join(sorted(SearchSpec.model_fields))
        ],
    ), lines


def test_an_arms_unknown_field_gets_a_suggestion(tmp_path, tiny_spec_dict):
    d = {**tiny_spec_dict, "arms": [{"name": "a", "search": {"bas_lr": 0.01}}, {"name": "b"}]}
    assert validate(write_spec(tmp_path, d)) == (
        2,
        ["error: arms.0 (a): search.bas_lr: unknown field; did you mean `base_lr`?"],
    )


def test_several_errors_are_counted_one_a_line(tmp_path, tiny_spec_dict):
    d = copy.deepcopy(tiny_spec_dict)
    d["model"]["family"] = "lama"
    d["seeds"] = [True]
    code, lines = validate(write_spec(tmp_path, d))
    assert code == 2 and lines == [
        "error: invalid sweep spec (2 errors):",
        "  model.family: Input should be 'llama' or 'gpt2', got 'lama'",
        "  seeds.0: Input should be a valid integer, got true",
    ], lines


def test_a_spec_error_pickles_with_its_errors():
    exc = SpecError([("search.base_lr", "Input should be greater than 0, got -1")])
    back = pickle.loads(pickle.dumps(exc))
    assert back.errors == exc.errors and str(back) == str(exc)
    assert str(exc) == "invalid sweep spec: search.base_lr: Input should be greater than 0, got -1"
