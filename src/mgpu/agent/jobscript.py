"""A job script on the node: written where the job's user can run it, and its command line.

The master sends the script with the launch (`mgpu submit job.sh`), so it runs even where
the submit directory is not shared.  The agent's spool is private (0700, the agent's
account), which the job's user cannot walk; so, as Slurm keeps `slurm_script` in a
directory of the job's own, each run gets a fresh directory `mgpu-JOB.XXXX` in the temp
dir (0700, owned by the job's user) holding the script under its own name (0700, so `$0`
and `basename "$0"` look as they did at submit).  Both are removed when the run is
forgotten.  The file is written through its descriptor before it changes hands.

The script runs with its `#!` interpreter, read as the kernel reads it (the interpreter,
then at most one argument: the rest of the line), else `/bin/sh`; the interpreter is
given the path, so a temp dir mounted `noexec` does not matter.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

__all__ = ["interpreter", "remove", "write"]


def interpreter(text: str) -> list[str]:
    """The command that runs a script of this text (to which its path is appended)."""
    first = text.split("\n", 1)[0]
    if first.startswith("#!"):
        line = first[2:].strip()
        if line:
            parts = line.split(None, 1)
            return parts if len(parts) == 1 else [parts[0], parts[1].strip()]
    return ["/bin/sh"]


def write(job_id: str, name: str, text: str, owner: tuple[int, int] | None) -> str:
    """Write the script for one run; its path.  `owner`: (uid, gid) of the job's user
    when the job runs as another account than the agent's."""
    folder = tempfile.mkdtemp(prefix=f"mgpu-{job_id}.")
    base = os.path.basename(name)
    path = os.path.join(folder, base if base not in ("", ".", "..") else "script")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o700)
        try:
            data = memoryview(text.encode("utf-8"))
            while data:
                data = data[os.write(fd, data) :]
            if owner is not None:
                os.fchown(fd, *owner)
        finally:
            os.close(fd)
        if owner is not None:
            os.chown(folder, *owner)
    except BaseException:
        remove(path)
        raise
    return path


def remove(path: str) -> None:
    """Remove a script written by `write` and its directory."""
    with contextlib.suppress(OSError):
        os.unlink(path)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(path))
