"""The sweep's side of the workload interface: facts about a spec's workload that the driver needs
(FLOPs per trained token and their convention, real tokens per sequence).

The only module of ``sweeps.run`` besides the trainable, preflight and branching that asks
``workloads`` anything.
"""

from __future__ import annotations

import logging

from sweeps.spec import SweepSpec

__all__ = ["flops_accounting", "tokens_per_sequence"]

log = logging.getLogger(__name__)


def flops_accounting(spec: SweepSpec) -> tuple[float | None, str]:
    """FLOPs per trained token of the sweep's model and the convention they follow."""
    from workloads.flops import FLOPS_CONVENTION

    try:
        if spec.workload == "pretrain":
            from workloads.data import tokenizer_vocab_size
            from workloads.flops import flops_per_token
            from workloads.model import ModelConfig, _hf_config, shape_of

            m = spec.model
            hf = _hf_config(ModelConfig(family=m.family, d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads,
                                        d_ff=m.d_ff_resolved, context_length_tokens=m.context_length_tokens,
                                        vocab_size=tokenizer_vocab_size(spec.data.tokenizer)))
            return flops_per_token(shape_of(hf, m.context_length_tokens)), FLOPS_CONVENTION
        from workloads.finetune_data import finetune_flops_convention, finetune_flops_per_token

        lora = spec.finetune.lora.model_dump() if spec.finetune and spec.finetune.lora else None
        return (finetune_flops_per_token(spec.finetune.checkpoint_dir, spec.model.context_length_tokens, lora),
                finetune_flops_convention(lora))
    except Exception:  # noqa: BLE001 - reporting only
        log.exception("could not count FLOPs per token")
        return None, FLOPS_CONVENTION


def tokens_per_sequence(spec: SweepSpec) -> float:
    """Real tokens one sequence of a batch holds: the context length when pretraining (packed), the
    training rows' mean non-padding tokens when fine-tuning (``finetune_data.check_finetune_inputs``)."""
    if spec.workload != "finetune":
        return float(spec.model.context_length_tokens)
    from workloads.finetune_data import check_finetune_inputs

    return float(check_finetune_inputs(spec)["mean_real_tokens_per_row"])
