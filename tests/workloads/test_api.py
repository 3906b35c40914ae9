"""The public interface: one entry per workload, light to import, and what sweeps may use."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from workloads import api
from workloads.config import DataConfig, FinetuneConfig, ModelConfig, WorkloadConfig
from workloads.model.flops import FLOPS_CONVENTION


def test_every_name_has_an_entry_and_unknown_names_are_refused():
    from workloads import finetune, pretrain

    assert sorted(api.WORKLOAD_NAMES) == ["finetune", "pretrain"]
    for name in api.WORKLOAD_NAMES:
        w = api.get_workload(name)
        module = {"pretrain": pretrain, "finetune": finetune}[name]
        assert w.name == name and w.train is getattr(module, f"run_{name}")
        assert w.check_inputs is getattr(module, f"check_{name}_inputs")
    assert api.get_workload("pretrain").config_type is ModelConfig
    assert api.get_workload("finetune").config_type is FinetuneConfig
    # branched training is defined for pretraining only
    assert api.get_workload("pretrain").train_in_process is pretrain.train_in_process
    assert api.get_workload("finetune").train_in_process is None
    with pytest.raises(KeyError, match="unknown workload 'distill'"):
        api.get_workload("distill")


def test_importing_the_api_loads_no_training_stack():
    code = (
        "import sys, workloads.api\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'ray', 'peft'))\n"
        "assert not bad, bad\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


#: the modules the public constants come from (they carry no ``__module__``)
_CONSTANTS = {
    "WORKLOAD_NAMES": "workloads.config",
    "WorkloadName": "workloads.config",
    "DETERMINISTIC_WARN_ONLY": "workloads.train.determinism",
    "FLOPS_CONVENTION": "workloads.model.flops",
    "FLOPS_MODEL_TYPES": "workloads.model.flops",
    "GIVEN_FLOPS_CONVENTION": "workloads.model.flops",
    **{n: "workloads.train.report" for n in ("REPORT_KEYS", "MLFLOW_METRICS", "ONCE_PER_ATTEMPT", "COMM_METRICS")},
    **{
        n: "workloads.sections"
        for n in (
            "OPTIMIZER_NAMES",
            "OptimizerName",
            "LR_RULES",
            "LrRule",
            "SYNC_MODES",
            "SyncMode",
            "PARALLELISMS",
            "Parallelism",
            "MIXED_PRECISIONS",
            "MixedPrecision",
            "PositiveInt",
            "MAX_TOKENS",
            "MAX_BATCH_SEQUENCES",
            "MAX_WIDTH",
            "MODEL_SHORTHAND_FIELDS",
            "TRAINING_FIELDS",
        )
    },
}


def test_every_public_name_resolves():
    """Each public name is the object its defining module holds (a lazy one its module in ``_LAZY``)."""
    assert len(set(api.__all__)) == len(api.__all__) and set(api._LAZY) <= set(api.__all__)
    for name in api.__all__:
        obj = getattr(api, name)
        module = api._LAZY.get(name) or _CONSTANTS.get(name) or obj.__module__
        assert module.split(".")[0] == "workloads", (name, module)
        assert getattr(importlib.import_module(module), name) is obj, name
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        api.nope


def test_pretrain_entry_counts_flops_and_checks_the_corpus():
    wc = WorkloadConfig(
        model=ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, context_length_tokens=32),
        data=DataConfig(path=str(ROOT / "data" / "tinyshakespeare" / "input.txt")),
    )
    w = api.get_workload("pretrain")
    flops, convention = w.flops_per_token(wc)
    # llama (gated MLP), d = 32, 1 layer, d_ff = 64, n_ctx = 32, byte vocabulary 256:
    # 6 N_matmul (4 d^2 attention + 3 d d_ff MLP) + 12 n_layer n_ctx d + 6 d V
    assert flops == 6 * (4 * 32 * 32 + 3 * 32 * 64) + 12 * 1 * 32 * 32 + 6 * 32 * 256 == 122880
    assert convention == FLOPS_CONVENTION
    facts = w.check_inputs(wc)
    assert facts["mean_real_tokens_per_row"] == 32.0 == w.tokens_per_sequence(wc)
    # one token a byte; the validation split is the last int(10 %) of them (data.validation_fraction 0.1)
    n_bytes = os.path.getsize(wc.data.path)
    assert facts["vocab_size"] == 256 and facts["validation_tokens"] == int(n_bytes * 0.1)
    assert facts["train_tokens"] == n_bytes - int(n_bytes * 0.1)
    with pytest.raises(api.DataError, match="^data.path: corpus not found"):
        w.check_inputs(WorkloadConfig(model=wc.model, data=DataConfig(path=str(ROOT / "nowhere.txt"))))
