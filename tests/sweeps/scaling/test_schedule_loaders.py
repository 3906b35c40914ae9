"""The files ``critbatch schedule`` writes, read by each trainer's own code where it is installed, against the
JSON ramp at every stage boundary.

* OLMo-core: ``olmo_core.json`` through ``TrainerConfig.from_dict`` (its config loader) to a
  ``BatchSizeSchedulerCallback``, which then drives OLMo-core's own data-loader batch size over a run.
* Levanter: ``levanter.yaml``'s ``trainer:`` through draccus into Levanter's ``TrainerConfig`` and its
  ``BatchSchedule`` (what its data loader reads).
* Megatron-LM: ``megatron.txt`` split as a shell would, its value handed to ``megatron.core``'s
  ``StepBatchsizeNumMicroBatchesCalculator`` with ``seq_length`` = tokens per sequence (as
  ``megatron/training/global_vars.py`` does), updated with the consumed samples as its training loop does.

None of these is a dependency of this project: each test skips where its project is not importable, and
``scripts/check_schedule_formats.sh`` builds scratch environments that have them and runs this file there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from sweeps.scaling import StudyMember, scale_result
from sweeps.scaling.schedule import batch_size_ramp, bounded_ramp, ramp_formats, schedule_files

TOKENS_PER_SEQUENCE = 64


def _law() -> dict[str, Any]:
    members = [
        StudyMember(d, 16 * (d / 2.6e5) ** 0.5, (12 * (d / 2.6e5) ** 0.5, 21 * (d / 2.6e5) ** 0.5))
        for d in (1.3e5, 2.6e5, 5.2e5, 1.05e6)
    ]
    return scale_result(members, predict_tokens=1e8)


RAMPS = {
    "law": lambda: batch_size_ramp(_law(), 3e7, TOKENS_PER_SEQUENCE),
    "local_cbs": lambda: bounded_ramp(
        1e6, TOKENS_PER_SEQUENCE, local_cbs=[(0.0, 8.0), (64_000.0, 16.0), (256_000.0, 64.0)]
    ),
    "law_and_local_cbs": lambda: bounded_ramp(
        3e7, TOKENS_PER_SEQUENCE, result=_law(), local_cbs=[(0.0, 2.0), (1e5, 4.0), (4e5, 32.0)]
    ),
    # three doublings on one step: one stage, x8
    "jump": lambda: bounded_ramp(
        3e7, TOKENS_PER_SEQUENCE, result=_law(), local_cbs=[(0.0, 2.0), (1e6, 64.0), (1e7, 4096.0)]
    ),
}


@pytest.fixture(params=sorted(RAMPS))
def written(request, tmp_path) -> tuple[Path, dict[str, Any]]:
    """A ramp and the folder ``critbatch schedule`` would write it to."""
    ramp = RAMPS[request.param]()
    assert len(ramp["stages"]) >= 2, "a ramp with no boundary checks nothing"
    for name, text in schedule_files(ramp_formats(ramp)).items():
        (tmp_path / name).write_text(text)
    return tmp_path, ramp


def _boundaries(ramp: dict[str, Any]) -> list[tuple[int, int, int]]:
    """``(start step, start tokens, batch sequences)`` of each stage."""
    return [(s["start_step"], s["start_tokens"], s["batch_size_sequences"]) for s in ramp["stages"]]


def test_olmo_core_builds_the_callback_and_switches_where_the_ramp_says(written, tmp_path):
    train = pytest.importorskip("olmo_core.train")
    loaders = pytest.importorskip("olmo_core.data.data_loader")
    callbacks = pytest.importorskip("olmo_core.train.callbacks")
    folder, ramp = written
    config = train.TrainerConfig.from_dict(
        {
            "save_folder": str(tmp_path / "run"),
            "callbacks": {"batch_size": json.loads((folder / "olmo_core.json").read_text())},
        }
    )
    callback = config.callbacks["batch_size"]
    assert isinstance(callback, callbacks.BatchSizeSchedulerCallback)  # its own checks passed in __post_init__
    base = loaders.DataLoaderBase
    stub = {name: (lambda self, *a, **k: None) for name in base.__abstractmethods__}
    tokens_per_batch = ramp["stages"][0]["batch_size_sequences"] * TOKENS_PER_SEQUENCE
    loader = type("Loader", (base,), stub)(work_dir=tmp_path, global_batch_size=tokens_per_batch, fs_local_rank=0)
    trainer = SimpleNamespace(data_loader=loader, global_step=0, global_train_tokens_seen=0, epoch=1)
    callback.trainer = trainer
    # the callback's own decision and the data loader's own setter; the learning-rate half needs a model
    callback._update_batch_size_and_lr = lambda size: setattr(loader, "global_batch_size", size)
    switches = []
    while trainer.global_train_tokens_seen < ramp["total_tokens"]:
        callback.pre_load_batch()
        if not switches or switches[-1][2] != loader.global_batch_size // TOKENS_PER_SEQUENCE:
            switches.append(
                (trainer.global_step, trainer.global_train_tokens_seen, loader.global_batch_size // TOKENS_PER_SEQUENCE)
            )
        loader.batches_processed += 1
        trainer.global_step += 1
        trainer.global_train_tokens_seen += loader.global_batch_size
    ours = _boundaries(ramp)
    assert [b for _, _, b in switches] == [b for _, _, b in ours]
    # OLMo-core raises the batch k-fold only after a multiple of k batches at the old size: on time, or up to
    # k - 1 steps of the old size later, never earlier
    late = 0
    for (_, olmo_tokens, _), (_, our_tokens, after), (_, _, before) in zip(switches[1:], ours[1:], ours):
        assert our_tokens <= olmo_tokens < our_tokens + after * TOKENS_PER_SEQUENCE
        late += olmo_tokens > our_tokens
    print(f"OLMo-core: {late} of {len(ours) - 1} switches after the ramp's boundary")
    assert abs(trainer.global_step - ramp["steps"]) <= len(ours)


def test_levanter_reads_the_batch_schedule_the_ramp_says(written):
    trainer = pytest.importorskip("levanter.trainer")
    draccus = pytest.importorskip("draccus")
    folder, ramp = written
    config = draccus.decode(trainer.TrainerConfig, yaml.safe_load((folder / "levanter.yaml").read_text())["trainer"])
    schedule = config.batch_schedule
    ours = _boundaries(ramp)
    for (step, tokens, batch), (_, _, before) in zip(ours, [ours[0], *ours]):
        assert schedule.batch_size_at_step(step) == batch
        assert schedule.batch_size_at_step(max(step - 1, 0)) == before
        assert schedule.global_data_offset_by_step(step) * TOKENS_PER_SEQUENCE == tokens
    end = schedule.global_data_offset_by_step(ramp["steps"]) * TOKENS_PER_SEQUENCE
    assert end >= ramp["total_tokens"] > schedule.global_data_offset_by_step(ramp["steps"] - 1) * TOKENS_PER_SEQUENCE


def _megatron_calculator():
    """``megatron/core/num_microbatches_calculator.py`` (standard library only), loaded by its path: from
    ``$CRITBATCH_MEGATRON_LM`` (a Megatron-LM checkout) or an installed megatron-core; skips when none has the
    step schedule."""
    roots = [Path(os.environ["CRITBATCH_MEGATRON_LM"]) / "megatron"] if os.environ.get("CRITBATCH_MEGATRON_LM") else []
    spec = importlib.util.find_spec("megatron")
    roots += [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    for root in roots:
        path = root / "core" / "num_microbatches_calculator.py"
        if not path.is_file():
            continue
        module_spec = importlib.util.spec_from_file_location("megatron_num_microbatches_calculator", path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        if hasattr(module, "StepBatchsizeNumMicroBatchesCalculator"):
            return module
    pytest.skip("no Megatron-LM with StepBatchsizeNumMicroBatchesCalculator (set CRITBATCH_MEGATRON_LM)")


def test_megatron_reads_the_schedule_the_ramp_says(written):
    calculators = _megatron_calculator()
    folder, ramp = written
    flag, value = shlex.split((folder / "megatron.txt").read_text())
    assert flag == "--step-batch-size-schedule"
    calculator = calculators.StepBatchsizeNumMicroBatchesCalculator(
        micro_batch_size=1,
        data_parallel_size=1,
        decrease_batch_size_if_needed=False,
        rank=1,
        schedule=value,
        seq_length=TOKENS_PER_SEQUENCE,
    )
    ours = _boundaries(ramp)
    assert calculator.global_batch_size == max(b for _, _, b in ours)  # what it sizes the dataset by
    consumed_samples, step, switches = 0, 0, []
    while consumed_samples * TOKENS_PER_SEQUENCE < ramp["total_tokens"]:  # as its training loop updates it
        calculator.update(consumed_samples, consistency_check=True)
        batch = calculator.get_current_global_batch_size()
        if not switches or switches[-1][2] != batch:
            switches.append((step, consumed_samples * TOKENS_PER_SEQUENCE, batch))
        consumed_samples += batch
        step += 1
    assert switches == ours and step == ramp["steps"]
