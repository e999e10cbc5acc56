"""What a command does once its job is queued: say its warnings, then print its id (or
JSON), or follow its output live (`-i`, srun).  Shared by `mgpu submit` (a command or a
job script) and `mgpu srun`."""

from __future__ import annotations

from mgpu.client import jsonlite as json
from mgpu.client.api import Client, SubmittedJob
from mgpu.client.console import warn

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any


def submitted(client: Client, job: SubmittedJob, args: argparse.Namespace) -> int:
    """After a submit: its warnings, then its id (or JSON), or its live output (`-i`)."""
    warn(job.warnings)
    if args.interactive:
        return follow_job(client, job.id, args)
    if args.json:
        out: dict[str, Any] = {"job_id": job.id}
        if job.task_ids is not None:
            out["task_ids"] = job.task_ids
        print(json.dumps(out))
    else:
        print(job.id)
    return 0


def follow_job(client: Client, job_id: str, args: argparse.Namespace) -> int:
    """Stream a job's output live; Ctrl-C cancels it, as srun does.  Returns its exit code."""
    from mgpu.client.stream import follow

    return follow(
        client,
        job_id,
        session_timeout=getattr(args, "session_timeout", None),
        max_wait_time=getattr(args, "max_wait_time", None) or 60.0,
        max_consecutive_timeouts=getattr(args, "max_consecutive_timeouts", None) or 3,
        verbose=bool(getattr(args, "verbose", False)),
    )
