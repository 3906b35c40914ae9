"""The workload registry: one :class:`Workload` entry per name (``pretrain``, ``finetune``), built on first use.

Re-exported by ``workloads.api`` (the package's public face); the Ray Train worker functions
(``workloads.ray.adapter``) read their entries here, so the face imports them and never the reverse.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workloads.config import WORKLOAD_NAMES, FinetuneConfig, ModelConfig, WorkloadConfig

__all__ = ["Workload", "get_workload"]


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What a sweep can ask of one workload.

    Attributes:
        name: ``"pretrain"`` or ``"finetune"`` (``TrialConfig.workload.name``).
        config_type: the section of :class:`WorkloadConfig` the workload is defined by: pretraining
            builds its model from ``model`` (:class:`ModelConfig`); fine-tuning reads its model
            from ``finetune`` (:class:`FinetuneConfig`).
        train: ``train(cfg: TrialConfig, *, device, report, resume_state=None, save_dir=None) ->
            TrainingOutcome``: one trial on this worker (what ``train_fn_per_worker`` runs), reporting
            at ``cfg.eval.milestones_tokens`` through ``report(metrics, state)``; raises
            :class:`DataError` for unusable inputs.
        flops_per_token: ``(config: WorkloadConfig) -> (FLOPs per real trained token, convention)``;
            raises :class:`DataError` (or a ``transformers``/tokenizer error) when it cannot count.
        check_inputs: ``(config: WorkloadConfig) -> facts``: loads everything a trial reads, as it
            would, and returns facts about it, always ``mean_real_tokens_per_row`` (the real tokens a
            "sequence" of the batch size holds); pretraining also ``train_tokens``,
            ``validation_tokens`` and ``vocab_size``; fine-tuning the data set's ``stats``,
            ``flops_per_token``, ``flops_convention``, ``adapter_params`` and ``checkpoint_dir``.
            Raises :class:`DataError` naming the field (``data.path: ...``, ``finetune....``).
        tokens_per_sequence: ``(config: WorkloadConfig) -> float``: ``mean_real_tokens_per_row``,
            without reading the corpus when rows are always full (pretraining: ``T``).
        train_in_process: ``(config: dict, state_path, save_states) -> {"status", "reports",
            "flops_per_token", "wall_s"}``: a trial (``TrialConfig.to_dict``) trained on CPU in this
            process, from a saved state or from the initialisation, saving the states reported at
            chosen tokens (a branched-training Ray task); None when the workload has none
            (branching is defined for pretraining only).
    """

    name: str
    config_type: type
    train: Callable[..., Any]
    flops_per_token: Callable[[WorkloadConfig], tuple[float, str]]
    check_inputs: Callable[[WorkloadConfig], dict[str, Any]]
    tokens_per_sequence: Callable[[WorkloadConfig], float]
    train_in_process: Callable[..., dict[str, Any]] | None = None


@functools.cache
def _entries() -> dict[str, Workload]:
    from workloads import finetune, pretrain

    def full_rows(wc: WorkloadConfig) -> float:
        return float(wc.model.context_length_tokens)

    return {
        "pretrain": Workload(
            name="pretrain",
            config_type=ModelConfig,
            train=pretrain.run_pretrain,
            flops_per_token=pretrain.pretrain_flops,
            check_inputs=pretrain.check_pretrain_inputs,
            tokens_per_sequence=full_rows,
            train_in_process=pretrain.train_in_process,
        ),
        "finetune": Workload(
            name="finetune",
            config_type=FinetuneConfig,
            train=finetune.run_finetune,
            flops_per_token=finetune.finetune_flops,
            check_inputs=finetune.check_finetune_inputs,
            tokens_per_sequence=finetune.finetune_tokens_per_sequence,
        ),
    }


def get_workload(name: str) -> Workload:
    """The entry of workload ``name``.

    Raises:
        KeyError: an unknown workload (the known ones named).
    """
    if name not in WORKLOAD_NAMES:
        raise KeyError(f"unknown workload {name!r}; known: {sorted(WORKLOAD_NAMES)}")
    return _entries()[name]
