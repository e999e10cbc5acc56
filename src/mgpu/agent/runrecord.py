"""What survives an agent restart, per run: its record (one small file in the spool,
`JOB.EPOCH.run`), and how a record is matched to the process it was made for."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from mgpu.agent import recycle
from mgpu.agent.spawn import BOOT_ID, process_start_ticks, process_start_time

__all__ = ["RunRecord", "RunRecords", "same_process"]

SAME_START = 0.05
"""Seconds two readings of one process's start time may differ by (clock ticks, boot time)."""


@dataclass
class RunRecord:
    """What survives an agent restart, per running job (in running.json)."""

    job_id: str
    epoch: int
    pid: int
    create_time: float
    start_time: float
    out_path: str
    err_path: str
    exit_path: str
    deadline: float | None = None
    kill_grace: float = 10.0
    out_sent: int = 0
    err_sent: int = 0
    tag: str = ""
    """$MGPU_RUN_TAG of this run's processes (empty in records of older agents)."""
    cgroup: str = ""
    """The run's cgroup (empty: none, the process tree is what is killed)."""
    hosts: str = ""
    """The `--mpi` hostfile written for this run, removed with its spool files."""
    devices: str = ""
    """The run's v1 devices cgroup, which denies it the GPUs it was not given (empty: none)."""
    signal: int = 0
    """`--signal`: sent `signal_lead` seconds before `deadline` (0: none), to the top
    process only when `signal_batch`; `signal_sent` once it went."""
    signal_lead: float = 0.0
    signal_batch: bool = False
    signal_sent: bool = False
    script: str = ""
    """The job script written for this run (mgpu.agent.jobscript), removed with it."""
    pty: bool = False
    """Runs on a terminal the agent held (it did not survive an agent restart)."""
    pool: str = ""
    """The pool its stdout, stderr and exit files go back to at its end (its user's uid:
    mgpu.agent.recycle); empty: they are removed."""
    start_ticks: int = 0
    """The shim's start in clock ticks since boot (0 in records of older agents: then
    `create_time` identifies it, which a clock step between two agents moves)."""
    boot_id: str = ""
    """The boot `start_ticks` counts from."""
    limits: list[str] = field(default_factory=list)
    """The run's v1 cgroups of its CPU and memory limits (mgpu.agent.runlimits)."""
    memory: str = ""
    """The cgroup whose memory counters are the run's (empty: none)."""


def same_process(rec: RunRecord) -> bool | None:
    """Is `rec.pid` still the process the record was made for?  None: no such process.
    By start ticks within one boot (a clock step between the agent that launched it and
    this one does not move them); by start time for a record of an older agent."""
    if rec.start_ticks and rec.boot_id and rec.boot_id == BOOT_ID:
        ticks = process_start_ticks(rec.pid)
        return None if ticks is None else ticks == rec.start_ticks
    started = process_start_time(rec.pid)
    return None if started is None else abs(started - rec.create_time) < SAME_START


class RunRecords:
    """The run records in a spool directory."""

    def __init__(self, spool: Path, pool: recycle.Pool) -> None:
        self.spool = spool
        self.pool = pool

    def path(self, rec: RunRecord) -> str:
        return f"{self.spool}/{rec.job_id}.{rec.epoch}.run"

    def save(self, rec: RunRecord, new: bool = False) -> None:
        """One small file per running job: cheaper than rewriting a shared index.  Written
        in place (a torn record after a crash fails to parse and is skipped; the master
        then treats that job as lost, which is what it was).  A `new` one is written into
        a file of the pool (mgpu.agent.recycle) and then renamed: never emptied, so an old
        record's blocks are not flushed first, and whole once it has its name."""
        path = self.path(rec)
        spare = self.pool.spare(recycle.RECORDS) if new else None
        try:
            data = orjson.dumps(vars(rec))  # flat: vars() = asdict(), no copy
        except orjson.JSONEncodeError:  # a path that is not UTF-8 (surrogate escapes)
            data = json.dumps(vars(rec)).encode()
        fd = os.open(spare or path, os.O_WRONLY | os.O_CREAT | (0 if spare else os.O_TRUNC), 0o600)
        try:
            os.write(fd, data)
            if spare:
                os.ftruncate(fd, len(data))  # the rest of what it held before
        finally:
            os.close(fd)
        if spare:
            os.rename(spare, path)

    def load(self) -> list[RunRecord]:
        """The records left by earlier agent processes; their files are kept from the pool."""
        records = []
        for path in sorted(self.spool.glob("*.run")):
            try:
                records.append(RunRecord(**json.loads(path.read_text())))
            except (OSError, ValueError, TypeError):
                continue
        self.pool.adopt({p for rec in records for p in (rec.out_path, rec.err_path, rec.exit_path)})
        return records
