"""The sweep's progress view and trial counts: trials paused at a rung (pruning mode "pause")."""

from types import SimpleNamespace

from rich.console import Console

from sweeps.run.progress import ProgressCallback


def test_progress_counts_paused_trials_apart_and_running_again_on_resume():
    console = Console(record=True, width=200, force_terminal=False)
    p = ProgressCallback(4, [4, 8], 2, console=console)
    a = SimpleNamespace(trial_id="a", config={"batch_size_sequences": 4}, status="RUNNING", last_result={})
    p.on_trial_start(0, [], a)
    a.status = "PAUSED"  # the scheduler paused it before the callbacks see the result
    p.on_trial_result(0, [], a, {"val_loss": 2.5})
    assert p.counts() == {"done": 0, "running": 0, "paused": 1, "failed": 0, "diverged": 0}
    assert "0 running, 1 paused" in p.render().renderables[0].plain
    a.status = "RUNNING"
    p.on_trial_start(0, [], a)  # promoted: resumed from its checkpoint
    assert p.counts()["running"] == 1 and p.counts()["paused"] == 0
