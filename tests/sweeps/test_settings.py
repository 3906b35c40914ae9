"""The CRITBATCH_* settings (sweeps/settings.py): defaults, parsed values, and refusals that name the variable."""

from __future__ import annotations

import pytest

from sweeps.errors import InvalidInput
from sweeps.settings import Settings, SettingsError, env_float, env_int


def test_unset_or_blank_variables_take_the_defaults():
    assert Settings.from_env({}) == Settings()
    assert Settings.from_env({"CRITBATCH_MLFLOW_DRAIN_S": " ", "CRITBATCH_TRACKING_SINKS": ""}) == Settings()
    d = Settings()
    assert (
        d.optuna_storage,
        d.storage_path,
        d.trial_runners,
        d.ray_connect_timeout_s,
        d.mlflow_drain_s,
        d.tracking_sinks,
    ) == (None, None, True, None, 300.0, ("mlflow",))


def test_values_are_read_into_their_fields():
    s = Settings.from_env(
        {
            "CRITBATCH_OPTUNA_STORAGE": "postgresql://db/optuna",
            "CRITBATCH_STORAGE_PATH": "s3://b/c",
            "CRITBATCH_TRIAL_RUNNERS": "0",
            "CRITBATCH_RAY_CONNECT_TIMEOUT_S": "2.5",
            "CRITBATCH_MLFLOW_DRAIN_S": "0",
            "CRITBATCH_TRACKING_SINKS": "mlflow, jsonl",
        }
    )
    assert s == Settings(
        optuna_storage="postgresql://db/optuna",
        storage_path="s3://b/c",
        trial_runners=False,
        ray_connect_timeout_s=2.5,
        mlflow_drain_s=0.0,
        tracking_sinks=("mlflow", "jsonl"),
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"CRITBATCH_RAY_CONNECT_TIMEOUT_S": "soon"},
            "CRITBATCH_RAY_CONNECT_TIMEOUT_S='soon' is not a number of seconds",
        ),
        (
            {"CRITBATCH_RAY_CONNECT_TIMEOUT_S": "0"},
            "CRITBATCH_RAY_CONNECT_TIMEOUT_S must be a positive number of seconds, got '0'",
        ),
        (
            {"CRITBATCH_MLFLOW_DRAIN_S": "-1"},
            "CRITBATCH_MLFLOW_DRAIN_S must be a non-negative number of seconds, got '-1'",
        ),
        ({"CRITBATCH_MLFLOW_DRAIN_S": "inf"}, "CRITBATCH_MLFLOW_DRAIN_S must be a non-negative number of seconds"),
    ],
)
def test_a_malformed_value_is_refused_naming_the_variable(env, message):
    with pytest.raises(SettingsError, match=message.replace("(", r"\(")) as info:
        Settings.from_env(env)
    assert isinstance(info.value, InvalidInput)  # the CLI exits 2


def test_the_parsers():
    assert env_float({"X": "1e3"}, "X") == 1000.0 and env_float({}, "X") is None
    assert env_int({"N": " 7 "}, "N") == 7 and env_int({"N": ""}, "N") is None
    with pytest.raises(SettingsError, match="N='7.5' is not an integer"):
        env_int({"N": "7.5"}, "N")


def test_the_cli_refuses_a_malformed_setting_with_exit_2_before_anything_starts(tiny_spec_dict, tmp_path):
    from tests.conftest import invoke_cli, write_spec

    spec = write_spec(tmp_path, tiny_spec_dict)
    r = invoke_cli(["run", str(spec), "--output", str(tmp_path / "out")], env={"CRITBATCH_MLFLOW_DRAIN_S": "later"})
    assert r.returncode == 2 and "CRITBATCH_MLFLOW_DRAIN_S='later' is not a number of seconds" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
