"""A restored searcher asks for exactly what the uninterrupted one would have (real Optuna RDB)."""

from __future__ import annotations

import copy

from sweeps.search.searcher import BatchSizeSearcher
from sweeps.spec import parse_spec


def _key(c):
    return (c["batch_size_sequences"], c["lr_rule"], c["lr_multiplier"], c["beta2_half_life_tokens"])


def test_a_restored_searcher_proposes_what_the_uninterrupted_one_would_have(tiny_spec_dict, tmp_path):
    """Saved after two asks per batch size and restored, it goes on with the samplers' own state: the
    third and fourth suggestions equal an uninterrupted searcher's (before, the rebuilt samplers were
    seeded anew, so a resumed sweep differed from an uninterrupted one)."""
    d = copy.deepcopy(tiny_spec_dict)
    d["search"].update(trials_per_batch_size=4, batch_sizes_sequences=[4, 8], strategy="independent")
    s = parse_spec(d)
    straight = BatchSizeSearcher(s, f"sqlite:///{tmp_path / 'a.db'}", "sw")
    expected = [_key(straight.suggest(f"t{i}")) for i in range(8)]

    first = BatchSizeSearcher(s, f"sqlite:///{tmp_path / 'b.db'}", "sw")
    got = [_key(first.suggest(f"t{i}")) for i in range(4)]
    path = tmp_path / "searcher.pkl"
    first.save(str(path))
    restored = BatchSizeSearcher(s, f"sqlite:///{tmp_path / 'b.db'}", "sw")
    restored.restore(str(path))
    got += [_key(restored.suggest(f"t{i}")) for i in range(4, 8)]
    assert got == expected
    assert len(set(expected)) == 8  # and nothing is asked twice

    # the restored searcher's own saved state carries its samplers on (a second resume is exact too)
    restored.save(str(tmp_path / "again.pkl"))
    twice = BatchSizeSearcher(s, f"sqlite:///{tmp_path / 'b.db'}", "sw")
    twice.restore(str(tmp_path / "again.pkl"))
    assert set(twice._subs) == {4, 8} and not twice._sampler_blobs  # re-attached, each with its saved sampler
