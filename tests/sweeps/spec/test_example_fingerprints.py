"""The fingerprint (a part of every sweep id) of each example spec, as it was before ``search.strategy`` and
``resources.launcher`` took their names from the registries (``sweeps.spec.registry``): how a field's names are
owned must not change any sweep's id, nor the id a stored spec is resumed under."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeps.spec import load_spec, load_stored_spec

EXAMPLES = Path(__file__).resolve().parents[3] / "sweeps" / "examples"

#: ``load_spec(path).fingerprint()`` of each example, computed with the ``Literal`` name lists (commit e945a57)
FINGERPRINTS = {
    "gsm8k-finetune.yaml": "5a4a6c5724",
    "shakespeare-char-pruned.yaml": "5b275c7772",
    "shakespeare-char-seeds.yaml": "56da483bf4",
    "shakespeare-char-study.yaml": "aaa904a8b0",
    "shakespeare-char.yaml": "4ee76da875",
    "shakespeare-gqa.yaml": "e55360f55f",
    "shakespeare-optimizers.yaml": "aa253fa297",
    "shakespeare-sync.yaml": "17eea23845",
    "wikitext-bpe.yaml": "33a66c15c5",
}


def test_every_example_has_a_recorded_fingerprint():
    assert {p.name for p in EXAMPLES.glob("*.yaml")} == set(FINGERPRINTS)


@pytest.mark.parametrize("name, fingerprint", FINGERPRINTS.items(), ids=list(FINGERPRINTS))
def test_an_example_spec_keeps_its_fingerprint(name, fingerprint, tmp_path):
    spec = load_spec(EXAMPLES / name)
    assert spec.fingerprint() == fingerprint
    stored = tmp_path / "spec.json"  # as a sweep stores it and a resume reads it back
    stored.write_text(spec.model_dump_json())
    assert load_stored_spec(stored).fingerprint() == fingerprint
