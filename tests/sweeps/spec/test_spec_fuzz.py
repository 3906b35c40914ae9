"""Property-based spec fuzzing: every input validates or fails with exit 2 and field paths."""

import copy

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from critbatch.main import app
from sweeps.spec import SpecError, SweepSpec, parse_spec, parse_spec_text
from tests.conftest import TINY

BASE = yaml.safe_load(TINY.read_text())

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=10,
)


def _paths(d, prefix=()):
    if isinstance(d, dict):
        for k, v in d.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))


ALL_PATHS = list(_paths(BASE)) + [
    ("resources", "max_concurrent_trials"),
    ("optimizer", "beta1"),
    ("seeds",),
    ("targets",),
    ("branch",),
    ("batch_warmup",),
    ("pruning",),
    ("budget",),
]


def _check(outcome):
    if isinstance(outcome, SweepSpec):
        return
    assert isinstance(outcome, SpecError)
    assert outcome.errors
    for path, msg in outcome.errors:
        assert isinstance(path, str) and path and isinstance(msg, str) and msg


def _validate(data):
    try:
        return parse_spec(data)
    except SpecError as exc:
        return exc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(ALL_PATHS), value=values)
def test_mutating_one_field_validates_or_names_paths(path, value):
    d = copy.deepcopy(BASE)
    node = d
    for k in path[:-1]:
        node = node.setdefault(k, {}) if isinstance(node, dict) else node
        if not isinstance(node, dict):
            return
    node[path[-1]] = value
    _check(_validate(d))


@settings(max_examples=200, deadline=None)
@given(data=values)
def test_arbitrary_documents_never_crash(data):
    _check(_validate(data))


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=200))
def test_arbitrary_text_never_crashes(text):
    try:
        parse_spec_text(text)
    except SpecError as exc:
        _check(exc)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(ALL_PATHS), value=values)
def test_cli_validate_exits_0_or_2(tmp_path, path, value):
    d = copy.deepcopy(BASE)
    node = d
    for k in path[:-1]:
        if not isinstance(node, dict):
            return
        node = node.setdefault(k, {})
    if not isinstance(node, dict):
        return
    node[path[-1]] = value
    p = tmp_path / "fuzz.yaml"
    try:
        p.write_text(yaml.safe_dump(d))
    except yaml.YAMLError:
        return
    r = CliRunner().invoke(app, ["validate", str(p)])
    assert r.exit_code in (0, 2), r.output
    if r.exit_code == 2:
        assert "error" in r.output
    # accepted: no exception; refused: a clean exit 2, never a traceback
    assert r.exception is None if r.exit_code == 0 else (isinstance(r.exception, SystemExit) and r.exception.code == 2)
