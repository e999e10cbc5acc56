"""A job script on the node: its file is always inside its own fresh directory."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from mgpu.agent import jobscript


@pytest.fixture
def tmpdir_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("name", [".", "..", "", "a/..", "/", "x\0y", "n" * 256])
def test_a_name_that_is_no_file_name_falls_back_to_script(tmpdir_here: Path, name: str) -> None:
    """Whatever the master sent: `..` must never make the agent write in the temp dir."""
    path = jobscript.write("j1", name, "echo hi\n", None)
    try:
        assert os.path.basename(path) == "script"
        folder = os.path.dirname(path)
        assert os.path.dirname(folder) == str(tmpdir_here)
        assert os.path.basename(folder).startswith("mgpu-j1.")
        assert Path(path).read_text() == "echo hi\n"
        assert sorted(os.listdir(tmpdir_here)) == [os.path.basename(folder)]
    finally:
        jobscript.remove(path)
    assert os.listdir(tmpdir_here) == []


def test_an_ordinary_name_is_kept(tmpdir_here: Path) -> None:
    path = jobscript.write("j2", "dir/train.sh", "#!/bin/bash\n", None)
    try:
        assert os.path.basename(path) == "train.sh"
        assert os.stat(path).st_mode & 0o777 == 0o700
    finally:
        jobscript.remove(path)
