"""The sweep's side of the workload interface: the spec's sections as ``workloads`` configs, and
the facts about its workload that the driver needs (FLOPs per trained token and their convention,
real tokens per sequence).

Every conversion from the spec to a workload config is here (:func:`workload_config`) or in
:func:`sweeps.run.trainable.trial_config`; ``workloads`` never sees a ``SweepSpec``. Like the rest
of ``sweeps``, this module asks ``workloads`` only through :mod:`workloads.api`.
"""

from __future__ import annotations

import logging

from sweeps.spec import SweepSpec
from workloads.api import (
    FLOPS_CONVENTION,
    DataConfig,
    FinetuneConfig,
    LoraConfig,
    ModelConfig,
    WorkloadConfig,
    get_workload,
)

__all__ = ["workload_config", "model_config", "finetune_config", "flops_accounting", "tokens_per_sequence"]

log = logging.getLogger(__name__)


def model_config(spec: SweepSpec) -> ModelConfig:
    """The spec's ``model`` section, with ``d_ff`` resolved (``ModelSpec.d_ff_resolved``)."""
    m = spec.model
    return ModelConfig(family=m.family, d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads, d_ff=m.d_ff_resolved,
                       context_length_tokens=m.context_length_tokens, tie_word_embeddings=m.tie_word_embeddings)


def finetune_config(spec: SweepSpec) -> FinetuneConfig | None:
    """The spec's ``finetune`` section (None when it has none).

    Raises:
        workloads.api.DataError: a template without ``{prompt}`` (the spec does not check it).
    """
    ft = spec.finetune
    if ft is None:
        return None
    lora = None
    if ft.lora is not None:
        lora = LoraConfig(rank=ft.lora.rank, alpha=ft.lora.alpha, dropout=ft.lora.dropout,
                          target_modules=tuple(ft.lora.target_modules))
    return FinetuneConfig(checkpoint_dir=ft.checkpoint_dir, prompt_field=ft.prompt_field,
                          response_field=ft.response_field, prompt_template=ft.prompt_template, packing=ft.packing,
                          truncate=ft.truncate, lora=lora)


def workload_config(spec: SweepSpec, *, data_path: str | None = None, shards: str | None = None) -> WorkloadConfig:
    """Which workload the spec runs, on which model and data.

    Args:
        data_path: the data path the workers read (absolute); default the spec's as written (unused
            when the spec names ``data.shards``).
        shards: the prepared shards the workers memory-map (``sweeps.run.dataprep``, or the spec's
            ``data.shards`` resolved); default the spec's ``data.shards``.

    Raises:
        workloads.api.DataError: see :func:`finetune_config`.
    """
    d = spec.data
    path = None if d.shards is not None else (d.path if data_path is None else data_path)
    return WorkloadConfig(
        name=spec.workload,
        model=model_config(spec),
        data=DataConfig(path=path, tokenizer=d.tokenizer, validation_fraction=d.validation_fraction,
                        shards=shards if shards is not None else d.shards),
        finetune=finetune_config(spec),
    )


def flops_accounting(spec: SweepSpec) -> tuple[float | None, str]:
    """FLOPs per trained token of the sweep's model and the convention they follow
    (``(None, FLOPS_CONVENTION)`` when they cannot be counted; logged)."""
    try:
        return get_workload(spec.workload).flops_per_token(workload_config(spec))
    except Exception:  # noqa: BLE001 - reporting only
        log.exception("could not count FLOPs per token")
        return None, FLOPS_CONVENTION


def tokens_per_sequence(spec: SweepSpec) -> float:
    """Real tokens one sequence of a batch holds: the context length when pretraining (packed), the
    training rows' mean non-padding tokens when fine-tuning (``Workload.tokens_per_sequence``)."""
    return float(get_workload(spec.workload).tokens_per_sequence(workload_config(spec)))
