"""The sweep's store: what a sweep keeps on disk and how it is read back. ``state`` (``sweep.json``, the storage
layout), ``migrations`` (its schema versions, old Tune pickles), ``claims`` (the output folder's lock, the sweep
id's binding), ``inputs`` (the inputs' content hashes), ``reportlog`` and ``records`` (every report, and the
trials read back from them). The orchestration (``sweeps.run``) writes and reads through these; they never call
it."""
