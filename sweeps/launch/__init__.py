"""Launching trials: the Ray cluster a sweep runs on (``cluster``, ``reach``), the Tune trainable and the workload
config each trial runs with (``trainable``, ``workload``), the long-lived trial runners and the queue between
Tune's relays and them (``runners``, ``exchange``), and the reaper of trials Tune gave up on (``reaper``).
``resources.launcher`` chooses how trials start (``launcher``: a ``Launcher`` per name, the trial runners or a Ray
Train run per trial).
The orchestration (``sweeps.run``) calls these; they never call it."""
