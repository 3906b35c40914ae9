"""The model: Hugging Face causal-LM construction (``hf``) and its FLOP accounting (``flops``).

Where it stands: imports ``workloads.config`` and ``workloads.errors`` only (no data, no training
loop); checked by ``tests/test_layering.py``. Kept light: nothing is imported here (``workloads.api``
imports the torch-free ``flops``).
"""

from workloads import _moved

#: what the flat ``workloads/model.py`` defined before the package split (now ``hf``): still loads from here, for a
#: pickle that names it (``workloads/_moved.py``)
_OLD_NAMES = ("hf_config", "build_model", "shape_of", "model_flops_per_token", "check_model_config",
              "model_vocab_size", "peak_flops_per_s", "DEVICE_PEAK_BF16_FLOPS")


def __getattr__(name: str):
    return _moved.old_name("workloads.model.hf", _OLD_NAMES, name)
