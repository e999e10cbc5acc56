"""The running runs' peak memory the agent puts in each heartbeat (`Launcher.peaks`): the
kernel's count (v2 `memory.peak`, v1 `memory.max_usage_in_bytes`), else the highest use
sampled; none for a run whose memory is not counted, or that has ended."""

from __future__ import annotations

from pathlib import Path

from mgpu.agent.launcher import Launcher, Running
from mgpu.agent.runrecord import RunRecord

MB = 1 << 20


def _run(job_id: str, spool: Path, memory: Path | None) -> Running:
    rec = RunRecord(
        job_id=job_id,
        epoch=2,
        pid=1,
        create_time=1.0,
        start_time=1.0,
        out_path=str(spool / f"{job_id}.out"),
        err_path=str(spool / f"{job_id}.err"),
        exit_path=str(spool / f"{job_id}.exit"),
        tag=f"{job_id}.2.test",
        memory="" if memory is None else str(memory),
    )
    return Running(rec=rec)


def _cgroup(path: Path, **files: int) -> Path:
    path.mkdir()
    for name, value in files.items():
        (path / name.replace("__", ".")).write_text(f"{value}\n")
    return path


def test_each_running_runs_peak_so_far(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path / "spool", lambda *a: None)
    v2 = _cgroup(tmp_path / "v2", memory__events=0, memory__peak=300 * MB, memory__current=MB)
    v1 = _cgroup(tmp_path / "v1", memory__max_usage_in_bytes=100 * MB + 1)
    sampled = _cgroup(tmp_path / "sampled", memory__current=10 * MB)  # no peak kept
    runs = {
        "a": _run("a", tmp_path, v2),
        "b": _run("b", tmp_path, v1),
        "c": _run("c", tmp_path, sampled),
        "d": _run("d", tmp_path, None),  # not counted here
        "e": _run("e", tmp_path, v2),
    }
    runs["c"].peak_bytes = 50 * MB  # the watch saw more once
    runs["e"].exited.set()  # ended: its end carries its peak
    for job_id, run in runs.items():
        launcher.running[(job_id, 2)] = run
    assert sorted(launcher.peaks()) == [("a", 2, 300), ("b", 2, 101), ("c", 2, 50)]
