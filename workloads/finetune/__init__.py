"""The fine-tuning workload: supervised fine-tuning of a local Hugging Face checkpoint, full or LoRA.

``examples`` reads and tokenizes instruction JSON Lines, ``packing`` lays examples into rows,
``checkpoint`` finds, loads and writes checkpoints, ``lora`` holds the adapters and the FLOP
count, ``workload`` builds and runs a trial.
"""

from workloads.finetune.checkpoint import init_checkpoint, load_checkpoint_model, load_finetuned
from workloads.finetune.workload import (
    FINETUNE_META_FILE,
    FinetuneWorkload,
    build_finetune,
    check_finetune_inputs,
    finetune_flops,
    finetune_tokens_per_sequence,
    run_finetune,
    save_finetuned,
)

__all__ = [
    "FINETUNE_META_FILE",
    "FinetuneWorkload",
    "build_finetune",
    "check_finetune_inputs",
    "finetune_flops",
    "finetune_tokens_per_sequence",
    "init_checkpoint",
    "load_checkpoint_model",
    "load_finetuned",
    "run_finetune",
    "save_finetuned",
]
