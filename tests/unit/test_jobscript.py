"""The agent writes a job script under its name inside a fresh directory of its own, and
only there: a name that is no file name (a master that let one through) becomes `script`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mgpu.agent import jobscript


@pytest.mark.parametrize(
    ("name", "written"),
    [("job.sh", "job.sh"), (".", "script"), ("..", "script"), ("../x", "x"), ("", "script")],
)
def test_the_script_is_written_in_its_own_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, written: str
) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    path = jobscript.write("a1b2c3d4", name, "true\n", owner=None)
    try:
        folder = os.path.dirname(path)
        assert os.path.dirname(folder) == str(tmp_path)
        assert os.path.basename(path) == written and Path(path).read_text() == "true\n"
    finally:
        jobscript.remove(path)
    assert list(tmp_path.iterdir()) == []
