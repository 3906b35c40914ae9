"""The sweep's side of the workload interface: the spec's sections as ``workloads`` configs, and
the facts about its workload that the driver needs (FLOPs per trained token and their convention,
real tokens per sequence).

Every conversion from the spec to a workload config is here (:func:`workload_config`) or in
:func:`sweeps.launch.trainable.trial_config`; ``workloads`` never sees a ``SweepSpec``. Like the rest
of ``sweeps``, this module asks ``workloads`` only through :mod:`workloads.api`.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from sweeps.errors import InvalidInput
from sweeps.spec import SweepSpec
from sweeps.spec.hf_config import read_hf_config
from workloads.api import (
    FLOPS_CONVENTION,
    DataConfig,
    FinetuneConfig,
    ModelConfig,
    WorkloadConfig,
    get_workload,
    replace,
)

__all__ = [
    "WorkloadFacts",
    "check_model",
    "finetune_config",
    "flops_accounting",
    "model_config",
    "tokens_per_sequence",
    "with_inputs",
    "workload_config",
]

log = logging.getLogger(__name__)


def model_config(spec: SweepSpec) -> ModelConfig:
    """The spec's ``model`` section as the trial's: ``d_ff`` resolved (``ModelConfig.d_ff_resolved``) and a
    ``hf_config`` path read into its mapping (:func:`read_hf_config`).

    Raises:
        InvalidInput: ``model.hf_config``: see :func:`read_hf_config`, or a mapping the section refuses.
    """
    m = spec.model
    try:
        if m.hf_config is not None:
            return replace(ModelConfig.of(m), hf_config=read_hf_config(m.hf_config))
        return replace(ModelConfig.of(m), d_ff=m.d_ff_resolved)
    except ValidationError as exc:
        errors = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'model'}: {e['msg']}" for e in exc.errors())
        raise InvalidInput(f"model: {errors}") from None


def check_model(spec: SweepSpec) -> dict[str, Any]:
    """Build the model's ``transformers`` config as a trial would (no weights), before launch.

    Returns:
        ``workloads.api.check_model_config``'s facts: ``model_type``, ``vocab_size`` (the model's),
        ``flops_per_token``, ``flops_convention``; ``{}`` for fine-tuning (the checkpoint's model).

    Raises:
        InvalidInput: ``model.hf_config...`` or ``model.flops_per_token`` with fine-tuning; a missing or non-JSON config.json; an
            unknown ``model_type``; a value ``transformers`` refuses; a vocabulary smaller than the
            tokenizer's; an architecture the FLOPs formula does not know without ``model.flops_per_token``.
    """
    from workloads.api import check_model_config, tokenizer_vocab_size

    if spec.workload != "pretrain":
        if spec.model.hf_config is not None:
            raise InvalidInput(
                "model.hf_config: only pretraining builds a model from a config; fine-tuning "
                "reads it from finetune.checkpoint_dir"
            )
        if spec.model.flops_per_token is not None:
            raise InvalidInput(
                "model.flops_per_token: only pretraining takes it; fine-tuning counts the "
                "checkpoint's FLOPs (Llama, Mistral, Qwen2, Qwen3, OLMo-2 and GPT-2 families)"
            )
        return {}
    cfg = model_config(spec)
    try:
        vocab = tokenizer_vocab_size(spec.data.tokenizer)
    except Exception:  # noqa: BLE001 - an unusable tokenizer is data.tokenizer's error (check_data_files)
        return {}
    return check_model_config(cfg, vocab)  # DataError: an InvalidInput


def finetune_config(spec: SweepSpec) -> FinetuneConfig | None:
    """The spec's ``finetune`` section as the trial config's (None when it has none; the spec's section
    already passed the same checks, ``workloads.api.FinetuneConfig``)."""
    return None if spec.finetune is None else FinetuneConfig.of(spec.finetune)


def workload_config(spec: SweepSpec, *, data_path: str | None = None, shards: str | None = None) -> WorkloadConfig:
    """Which workload the spec runs, on which model and data.

    Args:
        data_path: the data path the workers read (absolute); default the spec's as written (unused
            when the spec names ``data.shards``).
        shards: the prepared shards the workers memory-map (``sweeps.run.dataprep``, or the spec's
            ``data.shards`` resolved); default the spec's ``data.shards``.

    Raises:
        InvalidInput: see :func:`model_config`.
    """
    d = spec.data
    path = None if d.shards is not None else (d.path if data_path is None else data_path)
    return WorkloadConfig(
        name=spec.workload,
        model=model_config(spec),
        data=replace(DataConfig.of(d), path=path, shards=shards if shards is not None else d.shards),
        finetune=finetune_config(spec),
    )


def with_inputs(workload: WorkloadConfig, *, data_path: str | None, shards: str | None) -> WorkloadConfig:
    """``workload`` (:func:`workload_config` of a spec, no overrides) with the inputs its workers read: what
    ``workload_config(spec, data_path=data_path, shards=shards)`` gives, without building it again.

    A spec that names ``data.shards`` keeps them (and no path) unless ``shards`` is given.
    """
    d = workload.data
    if d.shards is not None:
        return replace(workload, data=replace(d, shards=shards if shards is not None else d.shards))
    return replace(workload, data=replace(d, path=data_path, shards=shards))


def flops_accounting(spec: SweepSpec, workload: WorkloadConfig | None = None) -> tuple[float | None, str]:
    """FLOPs per trained token of the sweep's model and the convention they follow
    (``(None, FLOPS_CONVENTION)`` when they cannot be counted; logged).

    Args:
        workload: the spec's :func:`workload_config`, if already built.
    """
    try:
        return get_workload(spec.workload).flops_per_token(workload if workload is not None else workload_config(spec))
    except Exception:
        log.exception("could not count FLOPs per token")
        return None, FLOPS_CONVENTION


def tokens_per_sequence(spec: SweepSpec, workload: WorkloadConfig | None = None) -> float:
    """Real tokens one sequence of a batch holds: the context length when pretraining (packed), the
    training rows' mean non-padding tokens when fine-tuning (``Workload.tokens_per_sequence``).

    Args:
        workload: the spec's :func:`workload_config`, if already built.
    """
    return float(
        get_workload(spec.workload).tokens_per_sequence(workload if workload is not None else workload_config(spec))
    )


class WorkloadFacts:
    """:func:`flops_accounting` and :func:`tokens_per_sequence` of one sweep's workload, each counted on
    first use and kept (the first builds the model on the meta device; the second reads a fine-tuning set).

    Args:
        spec: the sweep's resolved spec.
        workload: its :func:`workload_config`.
    """

    def __init__(self, spec: SweepSpec, workload: WorkloadConfig):
        self._spec = spec
        self._workload = workload
        self._flops: tuple[float | None, str] | None = None
        self._tokens_per_sequence: float | None = None

    def flops(self) -> tuple[float | None, str]:
        """``(FLOPs per trained token or None, their convention)`` (:func:`flops_accounting`)."""
        if self._flops is None:
            self._flops = flops_accounting(self._spec, self._workload)
        return self._flops

    def tokens_per_sequence(self) -> float:
        """Real tokens per sequence (:func:`tokens_per_sequence`; its errors are raised, not kept)."""
        if self._tokens_per_sequence is None:
            self._tokens_per_sequence = tokens_per_sequence(self._spec, self._workload)
        return self._tokens_per_sequence
