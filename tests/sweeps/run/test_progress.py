"""The sweep's progress view and trial counts: trials paused at a rung (pruning mode "pause")."""

from types import SimpleNamespace

from rich.console import Console

from sweeps.run.progress import PLAIN_CHANGE_S, ProgressCallback


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


def test_a_resumed_sweep_counts_the_trials_it_had_already_ended():
    from sweeps.analysis import TrialRecord

    def rec(tid, b, status, losses):
        return TrialRecord(
            trial_id=tid,
            batch_size_sequences=b,
            seed=0,
            group_id=tid,
            status=status,
            hyperparameters={},
            tokens=[1.0] * len(losses),
            val_loss=losses,
        )

    p = ProgressCallback(6, [4, 8], 1, console=Console(record=True, width=200, force_terminal=False))
    p.replay(
        [
            rec("a", 4, "COMPLETED", [3.0, 2.5]),
            rec("b", 8, "PRUNED", [3.2]),
            rec("c", 8, "DIVERGED", [float("nan")]),
            rec("d", 4, "FAILED", [2.9]),
            rec("e", 8, "STOPPED", [3.1]),
        ]
    )
    # FAILED and STOPPED trials run again after Tuner.restore: not counted as ended
    assert p.counts() == {"done": 2, "running": 0, "paused": 0, "failed": 0, "diverged": 1}
    assert p.best == {4: 2.5, 8: 3.1}
    assert "2/6 done" in p.render().renderables[0].plain


def test_plain_output_prints_a_line_per_change_unwrapped_and_no_empty_best():
    """Output to a file: a line when the state changed, at most every PLAIN_CHANGE_S, none wrapped, none
    repeated (a newcomer's log had every count twice and a line ending in an empty "best: ")."""
    console = Console(record=True, width=60, force_terminal=False)
    p = ProgressCallback(14, [4, 8, 16], 2, console=console)
    a = SimpleNamespace(trial_id="a", config={"batch_size_sequences": 4}, status="RUNNING", last_result={})
    p.on_trial_start(0, [], a)  # the first state: a line
    p.on_trial_start(0, [], a)  # nothing changed: no line
    p.on_trial_result(0, [], a, {"val_loss": 2.5})  # changed, within PLAIN_CHANGE_S of the last line: none yet
    p._last_plain -= PLAIN_CHANGE_S
    p.on_trial_result(0, [], a, {"val_loss": 2.7})  # PLAIN_CHANGE_S later: the state not yet printed, 2.5
    p.on_trial_result(0, [], a, {"val_loss": 2.6})  # the best did not change: no line
    p.on_trial_complete(0, [], a)  # changed, but too soon: none yet
    p.close()  # the final state, which no line showed yet
    p.close()  # already shown: no line
    lines = console.export_text().splitlines()
    assert len(lines) == 3, lines  # none wrapped at the console's 60 columns
    assert lines[0].startswith("[progress] 0/14 done, 1 running") and "best" not in lines[0]
    assert lines[1].endswith("best val loss so far: B=4: 2.500") and len(lines[1]) > 60
    assert lines[2].startswith("[progress] 1/14 done, 0 running")
