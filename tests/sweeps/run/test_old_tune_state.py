"""A sweep stopped on an older critbatch resumes on this one: the Tune state such a sweep left
behind (``data/tune_state_e6ea0bf/``: ``tuner.pkl`` and ``searcher-state.pkl`` of a tiny sweep started on
revision e6ea0bf, before the CLI, the workloads subpackages and the merged sections moved classes, stopped
with Ctrl-C; made by ``scripts/resume_across_revisions.py /tmp/wt-old /tmp/xrev KEEP``) still unpickles,
is migrated as a resume does before ``Tuner.restore`` (``sweeps/store/migrations.py``), and the searcher
restores from it with its spec, groups and samplers.

The whole path (that stopped sweep resumed to SUCCEEDED with ``critbatch resume``) is the script's run, in
docs/design.md ("Layout"); this test keeps the two files' loading from breaking unnoticed.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

from sweeps.run.execute import check_tune_state_readable
from sweeps.store.migrations import migrate_tune_state

OLD = Path(__file__).parent / "data" / "tune_state_e6ea0bf"


def test_the_old_tune_state_passes_the_resume_check_and_migrates(tmp_path):
    from sweeps.search.searcher import BatchSizeSearcher

    shutil.copy(OLD / "tuner.pkl", tmp_path / "tuner.pkl")
    searcher_file = tmp_path / "searcher-state-2026-12-05_00-00-00.pkl"
    shutil.copy(OLD / "searcher-state.pkl", searcher_file)
    check_tune_state_readable(str(tmp_path))  # raises InvalidInput when a pickled class path is gone
    # its searcher lacks the attributes added since: tuner.pkl is rewritten, the searcher state needs nothing
    assert migrate_tune_state(tmp_path) == [tmp_path / "tuner.pkl"]
    check_tune_state_readable(str(tmp_path))
    with open(tmp_path / "tuner.pkl", "rb") as f:  # as Tuner.restore reads it, then restores the searcher
        searcher = pickle.load(f)["_tune_config"].search_alg
    assert isinstance(searcher, BatchSizeSearcher) and searcher.objectives == {}
    with open(searcher_file, "rb") as f:  # restore() reads it so, then opens the Optuna studies
        searcher.set_state(pickle.load(f))
    assert searcher.spec.search.batch_sizes_sequences == [4, 8] and not searcher.exhausted()


def test_the_old_searcher_state_restores_its_spec_groups_and_samplers():
    from sweeps.search.searcher import BatchSizeSearcher
    from sweeps.spec import SweepSpec

    with open(OLD / "searcher-state.pkl", "rb") as f:
        state = pickle.load(f)
    assert isinstance(state["spec"], SweepSpec) and state["spec"].search.batch_sizes_sequences == [4, 8]
    assert {g.batch for g in state["groups"].values()} <= {4, 8} and state["groups"]
    for blob in state["_sampler_blobs"].values():  # each batch size's Optuna sampler, pickled inside
        assert hasattr(pickle.loads(blob), "sample_relative")
    searcher = BatchSizeSearcher.__new__(BatchSizeSearcher)
    searcher.set_state(state)
    assert searcher.spec == state["spec"]
