"""The public interface: one entry per workload, light to import, and what sweeps may use."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT
from workloads import api
from workloads.config import DataConfig, ModelConfig, WorkloadConfig
from workloads.flops import FLOPS_CONVENTION


def test_every_name_has_an_entry_and_unknown_names_are_refused():
    for name in api.WORKLOAD_NAMES:
        w = api.get_workload(name)
        assert w.name == name and callable(w.train) and callable(w.check_inputs)
    assert api.get_workload("pretrain").config_type is ModelConfig
    with pytest.raises(KeyError, match="unknown workload 'distill'"):
        api.get_workload("distill")


def test_importing_the_api_loads_no_training_stack():
    code = ("import sys, workloads.api\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'ray', 'peft'))\n"
            "assert not bad, bad\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def test_every_public_name_resolves():
    for name in api.__all__:
        assert getattr(api, name) is not None, name


def test_pretrain_entry_counts_flops_and_checks_the_corpus():
    wc = WorkloadConfig(model=ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, context_length_tokens=32),
                        data=DataConfig(path=str(ROOT / "data" / "tinyshakespeare" / "input.txt")))
    w = api.get_workload("pretrain")
    flops, convention = w.flops_per_token(wc)
    assert flops > 0 and convention == FLOPS_CONVENTION
    facts = w.check_inputs(wc)
    assert facts["mean_real_tokens_per_row"] == 32.0 == w.tokens_per_sequence(wc)
    assert facts["vocab_size"] == 256 and facts["validation_tokens"] > 0
    with pytest.raises(api.DataError, match="^data.path: corpus not found"):
        w.check_inputs(WorkloadConfig(model=wc.model, data=DataConfig(path=str(ROOT / "nowhere.txt"))))
