"""The training machinery every workload shares: plain PyTorch, no Ray, no tracking.

``loop`` runs a trial's optimizer steps and milestone reports; ``step`` takes one step (micro-batches,
all-reduce, noise-scale estimates); ``schedule``, ``scaling`` and ``batching`` say the batch, LR and
beta2 in force; ``optim``, ``ema``, ``noise_scale``, ``evaluation``, ``sync``, ``parallel`` and
``determinism`` are the pieces the loop is built from; ``state_file`` writes a reported state to a checkpoint
file (a full disk named as such).

Where it stands: imports ``workloads.config`` and ``workloads.errors`` only, never ``workloads.data``
or ``workloads.model`` (a workload hands the loop its model and batches, ``loop.Workload``); checked by
``tests/test_layering.py``. Kept light: nothing is imported here, so ``workloads.api`` can import the
torch-free ``batching`` and ``scaling`` without torch.
"""
