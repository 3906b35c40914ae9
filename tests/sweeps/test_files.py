"""The one writer of a sweep's records (sweeps/files.py): a write that fails leaves the previous file,
no temporary file, and an error naming the path; on a real full filesystem where one can be mounted."""

from __future__ import annotations

import errno
import json
import os
import subprocess

import pytest

from sweeps import files
from sweeps.errors import WriteFailed


def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp") or ".tmp" in p.name)


def test_a_failed_write_leaves_the_previous_file_and_no_temporary_one(tmp_path, monkeypatch):
    path = tmp_path / "sweep.json"
    files.write_json(path, {"status": "RUNNING"})
    monkeypatch.setattr(os, "fsync", _enospc)  # where a delayed allocation reports a full disk
    with pytest.raises(WriteFailed) as err:
        files.write_json(path, {"status": "SUCCEEDED"})
    assert str(err.value) == f"no space left on device while writing {path}"
    assert err.value.out_of_space and err.value.path == str(path)
    assert json.loads(path.read_text()) == {"status": "RUNNING"}
    assert leftovers(tmp_path) == []


def test_a_writer_that_raises_midway_leaves_the_previous_file(tmp_path):
    path = tmp_path / "searcher.pkl"
    files.write_atomic(path, b"old")

    def half(f):
        f.write(b"half of a pickle")
        raise OSError(errno.EIO, "input/output error")

    with pytest.raises(WriteFailed, match="input/output error while writing"):
        files.write_atomic(path, half)
    assert path.read_bytes() == b"old" and leftovers(tmp_path) == []


def test_a_failed_append_is_cut_off_and_a_torn_line_does_not_swallow_the_next_row(tmp_path, monkeypatch):
    path = tmp_path / "t.jsonl"
    files.append_line(path, '{"tokens_seen": 1}')
    with open(path, "a") as f:
        f.write('{"tokens_seen": 2, "val')  # what a crash mid-append left before
    files.append_line(path, '{"tokens_seen": 3}')
    lines = path.read_text().splitlines()
    assert lines[0] == '{"tokens_seen": 1}' and lines[-1] == '{"tokens_seen": 3}' and len(lines) == 3
    before = path.read_bytes()
    monkeypatch.setattr(os, "fsync", _enospc)
    with pytest.raises(WriteFailed, match="no space left on device"):
        files.append_line(path, '{"tokens_seen": 4}')
    assert path.read_bytes() == before


def test_a_failed_tree_copy_keeps_the_old_tree(tmp_path, monkeypatch):
    src, dst = tmp_path / "src", tmp_path / "best"
    src.mkdir()
    (src / "model.safetensors").write_bytes(b"new")
    dst.mkdir()
    (dst / "model.safetensors").write_bytes(b"old")
    import shutil

    def copy_then_fill(src_file, dst_file, **_):  # what copytree reports when the disk fills mid-copy
        raise shutil.Error([(str(src_file), str(dst_file), "[Errno 28] No space left on device: 'x'")])

    monkeypatch.setattr(shutil, "copytree", lambda s, d, **k: (os.makedirs(d, exist_ok=True), copy_then_fill(s, d)))
    with pytest.raises(WriteFailed, match=f"^no space left on device while writing {dst}$") as err:
        files.replace_tree(src, dst)
    assert err.value.out_of_space
    assert (dst / "model.safetensors").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best", "src"]
    monkeypatch.undo()
    files.replace_tree(src, dst, extra={"critbatch.json": "{}"})
    assert (dst / "model.safetensors").read_bytes() == b"new" and (dst / "critbatch.json").read_text() == "{}"


def test_on_a_full_filesystem_writes_fail_whole_and_the_reserve_makes_room(tmp_path):
    """A real tmpfs (root only): filled up, a record's rewrite fails and leaves the old one; releasing the
    reserve kept at the start lets sweep.json be written."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here: needs root")
    try:
        reserve = files.SpaceReserve(mnt)
        reserve.keep()
        files.write_json(mnt / "sweep.json", {"status": "RUNNING"})
        with open(mnt / "filler", "wb", buffering=0) as f, pytest.raises(OSError):
            while True:
                f.write(b"\0" * 4096)
        with pytest.raises(WriteFailed, match=f"no space left on device while writing {mnt}/sweep.json"):
            files.write_json(mnt / "sweep.json", {"status": "FAILED", "error": "x" * 8192})
        assert json.loads((mnt / "sweep.json").read_text()) == {"status": "RUNNING"}
        assert leftovers(mnt) == []
        assert reserve.release()
        files.write_json(mnt / "sweep.json", {"status": "FAILED", "error": "x" * 8192})
        assert json.loads((mnt / "sweep.json").read_text())["status"] == "FAILED"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_out_of_space_cause_names_the_write():
    err = files.write_failed("/o/trials.json", OSError(errno.ENOSPC, "No space left on device"))
    try:
        try:
            raise err
        except WriteFailed as exc:
            raise RuntimeError("Tune wrapped it") from exc
    except RuntimeError as wrapped:
        assert files.out_of_space_cause(wrapped, "/o") == "no space left on device while writing /o/trials.json"
    assert files.out_of_space_cause(ValueError("a bug"), "/") is None
    assert "no space left on device in /o" in files.out_of_space_cause(
        RuntimeError("OSError: [Errno 28] No space left on device"), "/o"
    )
