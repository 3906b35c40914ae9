"""Test-only code that trial processes must be able to import: never used by a real run.

It sits inside the package because the suite's sweeps run on Ray clusters whose trial processes import
only the installed packages (``tests/`` is neither a package nor on their path). A test turns a hook on
by setting ``CRITBATCH_TEST_MILESTONE_HOOKS`` (:data:`workloads.train.hooks.MILESTONE_HOOKS_VAR`).
"""
