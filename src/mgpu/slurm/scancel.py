"""`scancel [ID...] [-u USER] [-n NAME] [-t STATE] [-p PARTITION] [--me]`: cancel jobs
(`ID`, an array `ID`, a task `ID_7`, tasks `ID_[1-3,5]`).  `-s/--signal SIG` sends SIG to
running jobs instead (as Slurm: to their steps, `-b` the batch script's shell only, `-f`
the batch script and its children too); a pending job: `Job is pending execution`."""

from __future__ import annotations

from mgpu.slurm import common, opts, output, states
from mgpu.slurm.common import fail

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PROG = "scancel"
USAGE = "[-u user] [-n name] [-t state] [-p partition] [--me] [--signal SIG] [job_id...]"
OPTIONS = opts.table(
    "user=/u name=/n state=/t partition=/p signal=/s me batch/b full/f interactive/i "
    "quiet/Q verbose/v account=/A qos=/q reservation=/R nodelist=/w wckey= clusters=/M "
    "help/h usage version/V"
)


def task_ids(word: str) -> list[str]:
    """`1234_[1-3,7]` -> ["1234_1", "1234_2", "1234_3", "1234_7"]; other ids as they are."""
    base, sep, rest = word.partition("_[")
    if not sep:
        return [word]
    if not rest.endswith("]"):
        raise fail(PROG, f"Invalid job id {word}")
    out: list[str] = []
    for part in rest[:-1].split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise fail(PROG, f"Invalid job id {word}")
        out += [f"{base}_{i}" for i in range(int(low), int(high if dash else low) + 1)]
    return out


def main(argv: list[str]) -> int:
    given, words = opts.command_line(PROG, argv, OPTIONS, USAGE)
    sig = _signal(given["signal"] or "") if "signal" in given else None
    ids = [i for word in words for part in word.split(",") if part for i in task_ids(part)]
    filters = {k for k in ("user", "name", "state", "partition", "me") if k in given}
    if not ids and not filters:
        raise fail(PROG, "No job identification provided")
    client = common.make_client()
    if filters:
        ids = _matching(client, given, ids)
    status = 0
    from mgpu.client.api import RequestError

    for job_id in ids:
        try:
            if sig is None:
                client.cancel(job_id)
            else:
                status |= _signalled(
                    job_id, client.signal(job_id, sig, "batch" in given, "full" in given)
                )
        except RequestError as e:
            status = 1
            if e.status == 404:
                output.err(
                    f"{PROG}: error: Kill job error on job id {job_id}: Invalid job id specified"
                )
            elif "already" not in str(e) or sig is not None:
                _kill_error(job_id, str(e))
            else:
                status = 0
    return status


def _signal(text: str) -> str:
    """A signal name (`USR1`, `SIGUSR1`) or number, as scancel takes them."""
    import signal

    name = text.strip().upper()
    if name.isdigit() and 0 < int(name) <= signal.SIGRTMAX:
        return name
    if (name if name.startswith("SIG") else "SIG" + name) in signal.Signals.__members__:
        return name
    raise fail(PROG, f"Invalid job signal: {text}")


def _kill_error(job_id: str, reason: str) -> None:
    """Slurm's line; the master says `job ID: REASON` where the reason is Slurm's."""
    reason = reason.removeprefix(f"job {job_id}: ")
    output.err(f"{PROG}: error: Kill job error on job id {job_id}: {reason}")


def _signalled(job_id: str, answer: dict[str, Any]) -> int:
    """An array's tasks that could not be signalled (pending ones), each said: 1 if any."""
    status = 0
    for row in answer.get("jobs") or ():
        if not row.get("changed"):
            _kill_error(str(row.get("job_id")), str(row.get("message")))
            status = 1
    return status


def _matching(client: Any, given: dict[str, str], ids: list[str]) -> list[str]:
    """The active jobs the filters name (among `ids`, when some are given)."""
    users = set((given.get("user") or "").split(",")) - {""}
    if "me" in given:
        users = {str(client.whoami()["user"])}
    names = set((given.get("name") or "").split(",")) - {""}
    partitions = set((given.get("partition") or "").split(",")) - {""}
    wanted = states.parse_states(PROG, given["state"]) if given.get("state") else None
    out = []
    for job in client.queue()["jobs"]:
        job_id = str(job["id"])
        if ids and job_id not in ids and str(job.get("array_job_id")) not in ids:
            continue
        if users and job.get("user") not in users:
            continue
        if names and common.job_name(job) not in names:
            continue
        if partitions and common.partition(job) not in partitions:
            continue
        if wanted is not None and states.state(job) not in wanted:
            continue
        out.append(job_id)
    return out
