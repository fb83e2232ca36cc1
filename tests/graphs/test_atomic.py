"""The one atomic writer (graphs.io.write_atomic): unique O_EXCL temp files, never a followed symlink."""

from __future__ import annotations

import gzip
import os
import stat

import pytest

from graphs.io import write_atomic, write_text_atomic


def _outside(tmp_path):
    victim = tmp_path / "outside" / "victim.txt"
    victim.parent.mkdir()
    victim.write_text("precious")
    return victim


@pytest.mark.parametrize("name", ["p.json", "g.json.gz"])
def test_a_symlink_at_the_old_temp_name_is_not_followed(tmp_path, name):
    # The old writer opened "<path>.<pid>.tmp" with truncation: a planted link there
    # made it overwrite whatever the link points at.
    victim = _outside(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    path = work / name
    os.symlink(victim, f"{path}.{os.getpid()}.tmp")
    os.symlink(victim, f"{path}.tmp")
    write_text_atomic(path, "new content")
    assert victim.read_text() == "precious"
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt") as f:
        assert f.read() == "new content"
    assert not path.is_symlink()
    # Only the two planted links and the file itself: the temporary file is gone.
    assert sorted(p.name for p in work.iterdir()) == sorted([name, f"{name}.{os.getpid()}.tmp", f"{name}.tmp"])


def test_a_symlink_at_the_target_is_replaced_not_written_through(tmp_path):
    victim = _outside(tmp_path)
    path = tmp_path / "p.json"
    os.symlink(victim, path)
    write_text_atomic(path, "mine")
    assert victim.read_text() == "precious"
    assert not path.is_symlink() and path.read_text() == "mine"


def test_bytes_writer_and_file_mode(tmp_path):
    path = tmp_path / "blob.bin"
    write_atomic(path, lambda f: f.write(b"\x00\x01"))
    assert path.read_bytes() == b"\x00\x01"
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600


def test_a_failing_writer_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "p.json"
    write_text_atomic(path, "old")

    def boom(f):
        f.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_atomic(path, boom)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["p.json"]


def test_gzip_output_is_reproducible(tmp_path):
    write_text_atomic(tmp_path / "a.json.gz", "same")
    write_text_atomic(tmp_path / "b.json.gz", "same")
    assert (tmp_path / "a.json.gz").read_bytes() == (tmp_path / "b.json.gz").read_bytes()
