"""A sweep started before the spec's sections embedded the trial config's resumes: Tune's saved
state holds its spec pickled by the old code, which must load and equal what it was.

``data/pickles_e6ea0bf.pkl`` was written by revision e6ea0bf (the last before the merge), from its checkout:
``{"revision", "blobs": {name: pickle bytes}, "dumps": {name: model_dump(mode="json")}}`` for the example specs,
a spec with every merged section set away from its defaults, and each section class pickled alone.
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest

from sweeps.spec import SweepSpec
from sweeps.spec.sweep import with_stored_defaults

OLD = pickle.loads((Path(__file__).parent / "data" / "pickles_e6ea0bf.pkl").read_bytes())

#: fields added after e6ea0bf, with the defaults an old spec loads with: search.precision's token reallocation
#: (``reallocate_tokens``, ``max_budget_multiple``), so a precision sweep resumed by this code reallocates in its later waves
ADDED_PRECISION_DEFAULTS = {"reallocate_tokens": True, "max_budget_multiple": 4}


def _as_now(dump: dict) -> dict:
    """An old dump with the fields added since, at their defaults."""
    out = copy.deepcopy(dump)
    if (out.get("search") or {}).get("precision"):
        out["search"]["precision"].update(ADDED_PRECISION_DEFAULTS)
    if "reallocate_tokens" not in out and set(out) == {"b_crit_ratio", "max_trials", "trials_per_wave"}:
        out.update(ADDED_PRECISION_DEFAULTS)  # PrecisionSpec pickled alone
    return out


@pytest.mark.parametrize("name", sorted(n for n in OLD["blobs"] if n.startswith("SweepSpec:")))
def test_a_spec_pickled_by_the_old_code_loads_as_it_was(name):
    spec = pickle.loads(OLD["blobs"][name])
    assert isinstance(spec, SweepSpec)
    assert spec.model_dump(mode="json") == _as_now(OLD["dumps"][name])
    # as it was stored: the fields added since at the values that keep its behaviour (no LR lattice)
    assert spec == SweepSpec.model_validate(with_stored_defaults(OLD["dumps"][name]))
    assert spec.search.lr_lattice_octaves is None
    assert pickle.loads(pickle.dumps(spec)) == spec


@pytest.mark.parametrize("name", sorted(n for n in OLD["blobs"] if not n.startswith("SweepSpec:")))
def test_a_section_pickled_alone_by_the_old_code_loads_as_it_was(name):
    section = pickle.loads(OLD["blobs"][name])
    assert type(section).__name__ == name
    assert section.model_dump(mode="json") == _as_now(OLD["dumps"][name])
    assert type(section).model_validate(section.model_dump()) == type(section).model_validate(OLD["dumps"][name])
