"""The pretraining workload: a ``transformers`` causal LM built from a config, on a text corpus or
prepared token shards (``workload``). It joins ``workloads.data``, ``workloads.model`` and
``workloads.train``; ``workloads.registry`` names it.
"""

from workloads.pretrain.workload import (
    PretrainWorkload,
    build_pretrain,
    check_pretrain_inputs,
    pretrain_flops,
    run_pretrain,
    save_pretrained_byte,
    train_in_process,
)

__all__ = [
    "PretrainWorkload",
    "build_pretrain",
    "check_pretrain_inputs",
    "pretrain_flops",
    "run_pretrain",
    "save_pretrained_byte",
    "train_in_process",
]
