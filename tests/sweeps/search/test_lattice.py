"""The LR lattice of ``search.strategy: transfer`` (sweeps/search/lattice.py), the clamp on a transferred centre,
and the spec field that turns the lattice on (a sweep stored before it existed keeps unsnapped LRs)."""

from __future__ import annotations

import copy
import math

import pytest

from sweeps.search.lattice import lattice_index, lattice_lr, snap_lr
from sweeps.search.searcher import BatchSizeSearcher
from sweeps.search.transfer import MAX_EXTRAPOLATION_OCTAVES, transfer_centre
from sweeps.spec import parse_spec, parse_stored_spec


def test_lattice_points_are_one_expression_and_snapping_goes_to_the_nearest():
    assert lattice_lr(0.003, 2, 0.5) == 0.003 * 2.0**1.0 == 0.006
    assert lattice_lr(0.003, -1, 0.5) == pytest.approx(0.003 / math.sqrt(2))
    assert lattice_index(0.0059, 0.003, 0.5) == 2 and lattice_index(0.0031, 0.003, 0.5) == 0
    # a point reached another way (centre times 2^offset) snaps back to the very same float
    assert snap_lr(0.003 * 2.0**0.5 * 2.0**0.5, 0.003, 0.5) == lattice_lr(0.003, 2, 0.5)
    assert snap_lr(0.003 * 2**0.24, 0.003, 0.5) == 0.003 and snap_lr(0.003 * 2**0.26, 0.003, 0.5) == lattice_lr(
        0.003, 1, 0.5
    )
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="lr"):
            lattice_index(bad, 0.003, 0.5)
    with pytest.raises(ValueError, match="positive"):
        lattice_lr(0.003, 1, 0.0)


def test_a_transferred_centre_never_leaves_the_measured_lrs_by_more_than_an_octave():
    """Three best LRs that rise steeply fit an exponent of 1 (clipped); carried across a doubling from the highest,
    the centre would be an octave above it: allowed. From a batch size far beyond (8x) it would be three octaves
    above: clamped to one octave above the highest best LR measured (the extrapolation that once put B = 256's
    trials two octaves above their optimum)."""
    best = {16: 0.002, 32: 0.004, 64: 0.008}
    centre, alpha = transfer_centre(128, 64, best)
    assert alpha == pytest.approx(1.0) and centre == pytest.approx(0.016)
    far, _ = transfer_centre(512, 64, best)
    assert far == pytest.approx(0.008 * 2**MAX_EXTRAPOLATION_OCTAVES) and far < 0.008 * 8
    low, _ = transfer_centre(2, 16, best)
    assert low == pytest.approx(0.002 / 2**MAX_EXTRAPOLATION_OCTAVES)


def test_the_searcher_places_every_transfer_trial_on_the_lattice(tiny_spec_dict, tmp_path):
    d = copy.deepcopy(tiny_spec_dict)
    d["search"].update(
        {
            "strategy": "transfer",
            "batch_sizes_sequences": [8, 16],
            "base_batch_size_sequences": 8,
            "trials_per_batch_size": 3,
            "base_lr": 0.003,
            "lr_rules": ["sqrt"],
            "lr_multiplier": [0.7, 1.3],
        }
    )
    spec = parse_spec(d)
    assert spec.search.lr_lattice_octaves == 0.5
    searcher = BatchSizeSearcher(spec, f"sqlite:///{tmp_path / 'o.db'}", "lat")
    cfgs = [searcher.suggest(t) for t in "abc"]
    for c in cfgs:  # the centre, base_lr x sqrt(0.7 x 1.3), snapped to base_lr
        k = math.log2(c["lr"] / 0.003) / 0.5
        assert c["lr"] == lattice_lr(0.003, round(k), 0.5)
    assert sorted(c["lr"] for c in cfgs) == [lattice_lr(0.003, k, 0.5) for k in (-2, 0, 2)]
    off = parse_spec({**d, "search": {**d["search"], "lr_lattice_octaves": None}})
    unsnapped = BatchSizeSearcher(off, f"sqlite:///{tmp_path / 'p.db'}", "off").suggest("a")
    assert unsnapped["lr"] == pytest.approx(0.003 * math.sqrt(0.7 * 1.3) / 2)  # the centre, an octave below


def test_a_spec_stored_before_the_lattice_keeps_its_unsnapped_lrs_and_its_fingerprint(tiny_spec_dict):
    d = copy.deepcopy(tiny_spec_dict)
    d["search"]["strategy"] = "transfer"
    new = parse_spec(d)
    dump = new.model_dump(mode="json")
    assert dump["search"]["lr_lattice_octaves"] == 0.5
    del dump["search"]["lr_lattice_octaves"]  # as a sweep started before the field existed stored it
    old = parse_stored_spec(dump)
    assert old.search.lr_lattice_octaves is None
    assert "lr_lattice_octaves" not in old.model_dump(mode="json")["search"]
    assert old.fingerprint() != new.fingerprint()
    with pytest.raises(ValueError, match="lr_lattice_octaves"):
        parse_spec({**d, "search": {**d["search"], "lr_lattice_octaves": 0}})
