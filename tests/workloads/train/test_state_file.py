"""A trial's checkpoint written into a full filesystem names the disk and the file, not only torch's
"unexpected pos" (``workloads.train.state_file``; the runner's ``save_checkpoint`` writes through it).

The writes go to a real tmpfs filled up by the test (mounting one needs root; skipped elsewhere); the
rule's other inputs (an errno in the chain, pyarrow's words) are exceptions built as the libraries raise them.
"""

from __future__ import annotations

import errno
import os
import pickle
import subprocess

import pytest
import torch

from workloads.errors import CritbatchError, OutOfSpace
from workloads.ray.runner import load_checkpoint, save_checkpoint
from workloads.train.state_file import out_of_space_error, save_state

#: what the filled tmpfs keeps free: room for a small file, not for :func:`big_state`
ROOM = 64 * 1024


def big_state() -> dict:
    """A state of about 400 KB (a tiny model's checkpoint is about that size)."""
    return {"model": {"w": torch.arange(100_000, dtype=torch.float32)}, "loop": {"step": 3}}


@pytest.fixture
def full_fs(tmp_path):
    """A 1 MiB tmpfs at ``tmp_path/fs``, filled but for :data:`ROOM` bytes (unmounted at the end); skips
    without the right to mount."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}): needs root")
    try:
        filler = mnt / "filler"
        with open(filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
        os.truncate(filler, filler.stat().st_size - ROOM)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_state_written_into_a_full_filesystem_names_the_disk_and_the_file(full_fs):
    with pytest.raises(OutOfSpace) as info:
        save_state(big_state(), str(full_fs / "x.pt"), shown_as="/sweep/out/train/train-1/ckpt-000002/trial_state.pt")
    exc = info.value
    assert exc.errno == errno.ENOSPC and isinstance(exc, OSError) and isinstance(exc, CritbatchError)
    text = str(exc)
    assert text.startswith(
        "no space left on device while writing the checkpoint to /sweep/out/train/train-1/ckpt-000002/trial_state.pt ("
    ), text
    assert "(torch: " in text and "enforce fail" not in text, text  # torch's own words kept, its prefix not
    again = pickle.loads(pickle.dumps(exc))  # a worker's error crosses Ray pickled
    assert type(again) is OutOfSpace and again.errno == errno.ENOSPC and str(again) == text
    (full_fs / "x.pt").unlink()
    save_state({"step": 3}, str(full_fs / "small.pt"))  # the room left still takes a small one
    assert torch.load(full_fs / "small.pt") == {"step": 3}


def test_torchs_write_error_reads_as_a_full_disk_only_where_the_disk_has_no_room(full_fs, tmp_path):
    """torch.save to a path (its own C++ file: no errno reaches Python) into the full tmpfs: the error is
    torch's alone; the rule calls it a full disk from the folder's free space, and not in a folder with room."""
    with pytest.raises(RuntimeError) as info:
        torch.save(big_state(), str(full_fs / "y.pt"))
    exc = info.value
    assert not isinstance(exc, OSError) and "unexpected pos" in str(exc) + str(exc.__context__), repr(exc)
    said = out_of_space_error(exc, "the checkpoint to Y", str(full_fs), by="torch")
    assert said is not None and said.errno == errno.ENOSPC, repr(exc)
    assert str(said).startswith("no space left on device while writing the checkpoint to Y ("), str(said)
    assert "bytes free; torch: " in str(said), str(said)
    assert out_of_space_error(exc, "the checkpoint to Y", str(tmp_path), by="torch") is None


def test_the_rule_reads_the_errno_in_the_chain_and_the_words_of_a_copy():
    def raised(exc: BaseException, context: BaseException | None = None) -> BaseException:
        try:
            try:
                if context is not None:
                    raise context
            finally:
                raise exc
        except BaseException as e:  # noqa: BLE001
            return e

    torch_error = raised(
        RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"),
        OSError(errno.ENOSPC, "No space left on device"),
    )
    said = out_of_space_error(torch_error, "the checkpoint to P", None, by="torch")
    assert str(said) == "no space left on device while writing the checkpoint to P (torch: unexpected pos 704 vs 598)"
    quota = out_of_space_error(OSError(errno.EDQUOT, "Disk quota exceeded"), "the checkpoint to P", None)
    assert quota.errno == errno.EDQUOT and str(quota) == "disk quota exceeded while writing the checkpoint to P"
    copy = OSError("When uploading part for key 'x': IOError: No space left on device")  # no errno: pyarrow's way
    assert str(out_of_space_error(copy, "the checkpoint to s3://b/x", None)).startswith(
        "no space left on device while writing the checkpoint to s3://b/x (OSError: When uploading"
    )
    assert out_of_space_error(RuntimeError("unexpected pos 1 vs 0"), "the checkpoint to P", None) is None  # no folder
    assert out_of_space_error(ValueError("bad state"), "the checkpoint to P", "/") is None
    assert out_of_space_error(said, "something else", None) is said  # said once, not wrapped again


def test_a_runner_checkpoint_on_a_full_disk_names_its_file_and_leaves_no_temporary_folder(full_fs):
    trial = full_fs / "train-1"
    with pytest.raises(
        OutOfSpace, match=f"no space left on device while writing the checkpoint to {trial}/ckpt-000001/trial_state.pt"
    ):
        save_checkpoint(str(trial), 1, big_state())
    assert os.listdir(trial) == []  # the temporary ".ckpt-000001-*" folder is gone
    folder = save_checkpoint(str(trial), 2, {"step": 2})  # a small one still fits
    assert load_checkpoint(f"{folder}/trial_state.pt") == {"step": 2}
