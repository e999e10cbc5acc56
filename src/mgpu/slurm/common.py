"""What every Slurm command shares: its errors and warnings, the client, Slurm's times."""

from __future__ import annotations

import os

from mgpu.durations import hms

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from mgpu.client.api import Client


class SlurmError(Exception):
    """A sentence the command prints as it is (Slurm's own words where it has them), and
    the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def fail(prog: str, message: str, code: int = 1) -> SlurmError:
    """`PROG: error: MESSAGE`, as Slurm says it."""
    return SlurmError(f"{prog}: error: {message}", code)


def warn(prog: str, message: str) -> None:
    from mgpu.slurm import output

    output.err(f"{prog}: warning: {message}")


ADDRESS: dict[str, str] = {}
"""`mgpu --host H --port P --token T squeue`'s options ("--host": "H", ...)."""


def make_client() -> Client:
    """The master of --host/--port or $MGPU_MASTER (inside a job: the job's), with --token,
    $MGPU_TOKEN or the user's token file, as `mgpu` finds them."""
    from mgpu.client.api import Client

    port = ADDRESS.get("--port")
    if port is not None and not port.isdigit():
        raise SlurmError(f"mgpu: error: --port {port!r} is not a port number", 2)
    return Client(
        host=ADDRESS.get("--host"),
        port=int(port) if port else None,
        token=ADDRESS.get("--token"),
    )


def job_id_of(job: dict[str, Any]) -> str:
    return str(job["id"])


def own_id(job: dict[str, Any]) -> str:
    """Its own job number, as Slurm's: an array task's is its array's plus its index (its
    SLURM_JOB_ID, `1238` for `1234_4`); any other job's is its id."""
    base, index = str(job.get("array_job_id") or ""), job.get("array_task_id")
    if base.isdigit() and isinstance(index, int):
        return str(int(base) + index)
    return str(job["id"])


def job_name(job: dict[str, Any]) -> str:
    """Its --job-name, else Slurm's default (the script's name; `wrap` for --wrap)."""
    return str(job.get("name") or slurm_block(job).get("job_name_default") or "")


def me() -> str:
    """This account's name, as the master knows users (their login names)."""
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (KeyError, ImportError):
        return os.environ.get("USER", "")


def clock(seconds: float | None, pad_hours: bool = True) -> str:
    """sacct's and scontrol's durations: `HH:MM:SS`, `D-HH:MM:SS`; without `pad_hours`
    squeue's TIME: `M:SS`, `H:MM:SS`, `D-HH:MM:SS` (None: no time yet, zero)."""
    return hms(max(0, int(seconds or 0)), pad_hours)


def elapsed(seconds: float | None) -> str:
    """squeue's TIME: `M:SS`, `H:MM:SS`, `D-HH:MM:SS`."""
    return clock(seconds, pad_hours=False)


def time_limit(job: dict[str, Any], style: str = "squeue") -> str:
    """A job's limit: squeue's `1:00:00` / `UNLIMITED`, or sacct's and scontrol's
    `01:00:00`."""
    limit = job.get("time_limit")
    if limit is None or limit == float("inf") or limit == "inf":
        return "UNLIMITED"
    return elapsed(limit) if style == "squeue" else clock(limit)


def timestamp(epoch: float | None, none: str = "Unknown") -> str:
    """Slurm's `2024-05-01T13:45:00` (local time)."""
    if not epoch:
        return none
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def hostlist(job: dict[str, Any]) -> str:
    """The job's nodes in Slurm's form (`node[001-002]`), in rank order: their names, as
    sinfo shows them and -w takes them."""
    hosts = [a["node_id"] for a in job.get("allocation") or ()]
    if len(hosts) <= 1:
        return hosts[0] if hosts else ""
    from mgpu.hostlist import compress  # imports re: only for multi-node jobs

    return compress(hosts)


def slurm_block(job: dict[str, Any]) -> dict[str, Any]:
    """The job's `slurm` block (sbatch's), or {} for a job of mgpu's own."""
    block = job.get("slurm")
    return block if isinstance(block, dict) else {}


DEFAULT_PARTITION = "main"
"""The partition of a job or node the master names none for (a cluster without
partitions in its config: mgpu.config.DEFAULT_PARTITION on the master's side)."""


def partition(job: dict[str, Any]) -> str:
    return str(slurm_block(job).get("partition") or job.get("partition") or DEFAULT_PARTITION)
