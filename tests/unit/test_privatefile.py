"""Secrets are written whole or not at all, mode 0600 (mgpu/privatefile.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mgpu.privatefile import write_private


def test_a_secret_is_written_whole_and_private_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "admin-token"
    leftover = tmp_path / "admin-token.tmp"
    leftover.write_text("old")
    leftover.chmod(0o644)  # a crash's leftover: its mode must not be reused
    old = os.umask(0)
    try:
        write_private(path, b"secret\n")
        write_private(path, b"another\n")  # replaces it
    finally:
        os.umask(old)
    assert path.read_bytes() == b"another\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["admin-token"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "join-token"
    write_private(path, b"first\n")
    (tmp_path / "join-token.tmp").mkdir()  # cannot be unlinked nor opened as a file
    with pytest.raises(OSError):
        write_private(path, b"second\n")
    assert path.read_bytes() == b"first\n"
