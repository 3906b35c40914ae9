"""A sweep started before the spec's sections embedded the trial config's (issue 32) resumes: Tune's saved
state holds its spec pickled by the old code, which must load and equal what it was.

``data/pickles_e6ea0bf.pkl`` was written by revision e6ea0bf (the last before the merge), from its checkout:
``{"revision", "blobs": {name: pickle bytes}, "dumps": {name: model_dump(mode="json")}}`` for the example specs,
a spec with every merged section set away from its defaults, and each section class pickled alone.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from sweeps.spec import SweepSpec

OLD = pickle.loads((Path(__file__).parent / "data" / "pickles_e6ea0bf.pkl").read_bytes())


@pytest.mark.parametrize("name", sorted(n for n in OLD["blobs"] if n.startswith("SweepSpec:")))
def test_a_spec_pickled_by_the_old_code_loads_as_it_was(name):
    spec = pickle.loads(OLD["blobs"][name])
    assert isinstance(spec, SweepSpec)
    assert spec.model_dump(mode="json") == OLD["dumps"][name]
    assert spec == SweepSpec.model_validate(OLD["dumps"][name])
    assert pickle.loads(pickle.dumps(spec)) == spec


@pytest.mark.parametrize("name", sorted(n for n in OLD["blobs"] if not n.startswith("SweepSpec:")))
def test_a_section_pickled_alone_by_the_old_code_loads_as_it_was(name):
    section = pickle.loads(OLD["blobs"][name])
    assert type(section).__name__ == name
    assert section.model_dump(mode="json") == OLD["dumps"][name]
    assert type(section).model_validate(section.model_dump()) == type(section).model_validate(OLD["dumps"][name])
