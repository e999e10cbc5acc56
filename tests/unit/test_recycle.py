"""Spool files go back to a pool per user and are renamed out of it for later runs."""

from __future__ import annotations

import os
from pathlib import Path

from mgpu.agent.recycle import RECORDS, Pool, recycle


def _file(path: Path, text: str = "old output\n") -> Path:
    path.write_text(text)
    return path


def test_a_finished_file_is_emptied_and_given_to_a_later_run_of_its_key(tmp_path: Path) -> None:
    pool = Pool(str(tmp_path))
    old = _file(tmp_path / "j1.1.out")
    inode = old.stat().st_ino
    moves = pool.names([(str(old), "1000")])
    pool.recycled(recycle(moves))
    assert not old.exists()
    pool.take("1001", str(tmp_path / "j2.1.out"))  # another user's pool: nothing there
    assert not (tmp_path / "j2.1.out").exists()
    pool.take("1000", str(tmp_path / "j3.1.out"))
    new = tmp_path / "j3.1.out"
    assert (new.stat().st_ino, new.read_text()) == (inode, "")
    assert pool.free["1000"] == []
    pool.take("1000", str(tmp_path / "j4.1.out"))  # empty pool: left to the caller's open
    assert not (tmp_path / "j4.1.out").exists()


def test_files_without_a_pool_and_beyond_its_size_are_removed(tmp_path: Path) -> None:
    pool = Pool(str(tmp_path), size=2)
    files = [_file(tmp_path / f"j{i}.1.run") for i in range(3)]
    script_dir = tmp_path / "script"
    script_dir.mkdir()
    script = _file(script_dir / "job.sh")
    moves = [(str(f), RECORDS) for f in files] + [(str(script), None), (str(script_dir), None)]
    pool.recycled(recycle(pool.names(moves)))
    assert len(pool.free[RECORDS]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        os.path.basename(p) for p in pool.free[RECORDS]
    )
    # Run records are not emptied (written over whole before they are named again).
    for name in pool.free[RECORDS]:
        assert Path(name).read_text() == "old output\n"
    spare = pool.spare(RECORDS)
    assert spare is not None and os.path.exists(spare) and spare not in pool.free[RECORDS]


def test_a_vanished_pool_file_is_skipped(tmp_path: Path) -> None:
    pool = Pool(str(tmp_path))
    a, b = _file(tmp_path / "a"), _file(tmp_path / "b")
    pool.recycled(recycle(pool.names([(str(a), "0"), (str(b), "0")])))
    os.unlink(pool.free["0"][-1])  # removed by hand
    pool.take("0", str(tmp_path / "new"))
    assert (tmp_path / "new").exists() and pool.free["0"] == []


def test_a_new_agent_process_adopts_the_pool_it_finds(tmp_path: Path) -> None:
    first = Pool(str(tmp_path))
    moves = [(str(_file(tmp_path / "o")), "0"), (str(_file(tmp_path / "x")), "0x")]
    moves.append((str(_file(tmp_path / "r")), RECORDS))
    first.recycled(recycle(first.names(moves)))
    _file(tmp_path / ".pool.junk")  # not a pool name: left alone
    second = Pool(str(tmp_path))
    second.adopt()
    assert {k: sorted(v) for k, v in second.free.items()} == {
        k: sorted(v) for k, v in first.free.items()
    }
    # Names given later do not collide with the adopted ones.
    (name,) = [n for _, n in second.names([(str(_file(tmp_path / "o2")), "0")])]
    assert name is not None and name not in second.free["0"] and not os.path.exists(name)
