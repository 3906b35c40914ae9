"""The model: Hugging Face causal-LM construction (``hf``) and its FLOP accounting (``flops``).

Where it stands: imports ``workloads.config`` and ``workloads.errors`` only (no data, no training
loop); checked by ``tests/test_layering.py``. Kept light: nothing is imported here (``workloads.api``
imports the torch-free ``flops``).
"""
