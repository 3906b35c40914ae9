"""What Ray Train workers run: the training machinery (``train/``), corpora (``data/``), the model
(``model/``), the two workloads (``pretrain/``, ``finetune/``) and the Ray Train adapter (``ray/``),
under the trial config (``config``), the registry (``registry``) and the public face ``api`` (the
only module ``sweeps`` imports).
"""
