"""Fixtures for the fine-tuning tests: a tiny byte-level checkpoint and small instruction files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.workloads.trial import with_sections
from workloads.config import (
    BatchConfig,
    DataConfig,
    EvalConfig,
    FinetuneConfig,
    LoraConfig,
    ModelConfig,
    OptimizerConfig,
    ScheduleConfig,
    TrialConfig,
    WorkloadConfig,
)

CONTEXT = 96
TEMPLATE = "Q: {prompt}\nA: "


def qa_records(n: int, start: int = 0) -> list[dict]:
    """``n`` short arithmetic question/answer pairs (27-40 bytes each with the template)."""
    out = []
    for i in range(start, start + n):
        a, b = 3 * i + 1, 7 * i + 2
        out.append({"question": f"What is {a} plus {b}?", "answer": f"{a}+{b}={a + b}\n#### {a + b}"})
    return out


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory) -> Path:
    """A freshly initialised 2-layer byte-level Llama (d_model 32), saved with its tokenizer."""
    from workloads.api import init_checkpoint

    return init_checkpoint(
        str(tmp_path_factory.mktemp("ckpt") / "tiny"),
        d_model=32,
        n_layers=2,
        n_heads=2,
        context_length_tokens=128,
        d_ff=64,
    )


@pytest.fixture
def qa_file(tmp_path) -> Path:
    return write_jsonl(tmp_path / "qa.jsonl", qa_records(40))


def ft_cfg(
    ckpt: Path,
    data: Path,
    *,
    lora: LoraConfig | None = None,
    packing: str = "packed",
    truncate: bool = False,
    **changes,
) -> TrialConfig:
    """A tiny fine-tuning trial on ``ckpt`` and ``data``; ``changes`` as :func:`tests.workloads.trial.with_sections`."""
    base = TrialConfig(
        trial_id="ft",
        workload=WorkloadConfig(
            name="finetune",
            model=ModelConfig(context_length_tokens=CONTEXT),
            data=DataConfig(path=str(data), validation_fraction=0.2),
            finetune=FinetuneConfig(
                checkpoint_dir=str(ckpt),
                prompt_field="question",
                response_field="answer",
                prompt_template=TEMPLATE,
                packing=packing,
                truncate=truncate,
                lora=lora,
            ),
        ),
        budget_tokens=3072,
        optimizer=OptimizerConfig(
            lr=3e-3, beta2=0.99, beta2_half_life_tokens=4 * CONTEXT * math.log(0.5) / math.log(0.99)
        ),
        schedule=ScheduleConfig(warmup_tokens=0, ema_half_life_tokens=1024),
        batch=BatchConfig(batch_size_sequences=4),
        eval=EvalConfig(milestones_tokens=(1536, 3072), eval_tokens=512),
        seed=0,
    )
    return with_sections(base, **changes)
