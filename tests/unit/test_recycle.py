"""Spool files go back to a pool per user and are used again, as they are, by later runs."""

from __future__ import annotations

import os
from pathlib import Path

from mgpu.agent import jobscript
from mgpu.agent.recycle import RECORDS, Pool, recycle


def _file(path: Path, text: str = "old output\n") -> Path:
    path.write_text(text)
    return path


def test_a_finished_file_is_emptied_and_given_to_a_later_run_of_its_key(tmp_path: Path) -> None:
    pool = Pool(str(tmp_path))
    first = pool.take("1000")  # an empty pool: a new name, made by the caller's open
    assert os.path.basename(first).startswith(".pool.1000.") and not os.path.exists(first)
    _file(Path(first))
    inode = os.stat(first).st_ino
    moves = pool.names([(first, "1000")])
    assert moves == [(first, first)]  # it keeps its name: no rename
    pool.recycled(recycle(moves))
    assert pool.take("1001") != first  # another user's pool: not this file
    again = pool.take("1000")
    assert again == first and (os.stat(again).st_ino, Path(again).read_text()) == (inode, "")
    assert pool.free["1000"] == []
    assert pool.take("1000") not in (first, None)  # empty pool again: a new name


def test_a_file_not_named_by_the_pool_is_renamed_into_it(tmp_path: Path) -> None:
    pool = Pool(str(tmp_path))
    old = _file(tmp_path / "j1.1.out")  # a run of an older agent
    pool.recycled(recycle(pool.names([(str(old), "1000")])))
    assert not old.exists()
    (name,) = pool.free["1000"]
    assert os.path.basename(name).startswith(".pool.1000.") and Path(name).read_text() == ""


def test_exit_files_keep_their_contents(tmp_path: Path) -> None:
    """An exit file is not truncated (its block stays): a run blanks its first line."""
    pool = Pool(str(tmp_path))
    path = pool.take("1000x")
    _file(Path(path), "0\n")
    pool.recycled(recycle(pool.names([(path, "1000x")])))
    assert pool.free["1000x"] == [path] and Path(path).read_text() == "0\n"


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


def test_a_vanished_pool_file_is_made_again_by_its_next_run(tmp_path: Path) -> None:
    pool = Pool(str(tmp_path))
    a, b = _file(tmp_path / "a"), _file(tmp_path / "b")
    pool.recycled(recycle(pool.names([(str(a), "0"), (str(b), "0")])))
    gone = pool.free["0"][-1]
    os.unlink(gone)  # removed by hand
    assert pool.take("0") == gone  # the caller's open (O_CREAT) makes it again


def test_a_new_agent_process_adopts_the_pool_it_finds(tmp_path: Path) -> None:
    first = Pool(str(tmp_path))
    moves = [(str(_file(tmp_path / "o")), "0"), (str(_file(tmp_path / "x")), "0x")]
    moves.append((str(_file(tmp_path / "r")), RECORDS))
    first.recycled(recycle(first.names(moves)))
    _file(tmp_path / ".pool.junk")  # not a pool name: left alone
    busy = _file(tmp_path / ".pool.0.999")  # named by a running run's record
    second = Pool(str(tmp_path))
    second.adopt(in_use={str(busy)})
    assert {k: sorted(v) for k, v in second.free.items()} == {
        k: sorted(v) for k, v in first.free.items()
    }
    # Names given later do not collide with the adopted ones, nor with the one in use.
    (name,) = [n for _, n in second.names([(str(_file(tmp_path / "o2")), "0")])]
    assert name is not None and name not in second.free["0"] and not os.path.exists(name)
    assert second.take("1") not in (str(busy), *second.free["0"])


def test_a_script_directory_replaced_by_a_link_is_not_followed(tmp_path: Path) -> None:
    """A job script's directory belongs to the job's user, who may put a symbolic link to
    any directory in its place: the root agent removes the link, nothing it points to."""
    victim = tmp_path / "etc"
    victim.mkdir()
    target = _file(victim / "passwd", "root:x:0:0\n")
    script_dir = tmp_path / "mgpu-j1.abcd"
    script_dir.symlink_to(victim)
    recycle([(str(script_dir / "passwd"), None), (str(script_dir), None)])
    assert target.read_text() == "root:x:0:0\n"
    assert not os.path.lexists(script_dir)  # the link itself went


def test_a_script_file_replaced_by_a_link_removes_the_link_only(tmp_path: Path) -> None:
    victim = _file(tmp_path / "victim")
    script_dir = tmp_path / "mgpu-j2.abcd"
    script_dir.mkdir()
    (script_dir / "job.sh").symlink_to(victim)
    recycle([(str(script_dir / "job.sh"), None), (str(script_dir), None)])
    assert victim.exists() and not os.path.lexists(script_dir)


def test_jobscript_remove_does_not_follow_a_linked_directory(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    kept = _file(victim / "job.sh")
    link = tmp_path / "mgpu-j3.abcd"
    link.symlink_to(victim)
    jobscript.remove(str(link / "job.sh"))
    assert kept.exists()
