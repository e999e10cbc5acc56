"""Admission control: the rules a job must meet to be queued at all.

Configured under `site.admission` in the cluster config:

    site:
      admission:
        max_gpus_per_job: 8
        max_nodes_per_job: 2
        max_time_per_job: "2-00:00:00"    # a job without --time gets this limit
        allowed_users: [alice, bob]        # with allowed_groups: either grants access
        allowed_groups: [gpu-users]
        validator: /etc/mgpu/job_validator.sh
        validator_timeout: 10

`Cluster.submit` builds the jobs of a `JobSpec` and hands them to `Admission.admit`, which
runs, as Nomad's job endpoint hooks do, the **mutators** first (defaults the site sets:
MaxTime is also the limit of a job without `--time`) and then the **validators**, cheapest
first: who may submit, the site's per-job limits, the per-user GPU cap
(`scheduling.max_gpus_per_user`), dependencies on known jobs, whether the job could ever
run on the known nodes (`could_ever_fit`), and last the site's external validator.  The
tasks of an array differ only in their index, so the validators judge the first one.  A
refusal is a `SubmitError` with one sentence for the user; the master answers 400 and
records a `submit_refused` audit event; nothing is queued.

The validator (the seeds' `job_validator.sh`) is run with `/bin/sh -c` and gets the job
as JSON on stdin (`user`, `groups`, `command`, `argv`, `gpus`, `nodes`, `time_limit`,
`image`, ...).  Exit 0 accepts; anything else refuses, the first line it printed being
the reason.  A validator that does not answer within `validator_timeout` seconds, or
cannot be run, refuses the job (fail closed).  It runs inside the submit request, as
Slurm's job_submit plugins do, as an asyncio subprocess: a slow validator delays that
submission only, never the master's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mgpu import spec as specs
from mgpu.config import Admission as AdmissionConfig
from mgpu.master.control.submit import JobSpec, SubmitError
from mgpu.master.state.asks import AskRules
from mgpu.model import Job
from mgpu.scheduler import could_ever_fit
from mgpu.scheduler.placement import shape_key
from mgpu.scheduler.types import JobRequest, NodeView

CONTAINER_FEATURE = "container"
MAX_REASON_CHARS = 300
"""A validator's reason is cut here: it is one sentence, not a log."""


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@dataclass(frozen=True)
class AdmissionContext:
    """What the validators may look at besides the job: the master's current view."""

    nodes: Sequence[NodeView]
    """The nodes known now; empty before any joined (then nothing is judged against them)."""
    request_for: Callable[[Job], JobRequest]
    """The job as the scheduler sees it (access rules included)."""
    job_exists: Callable[[str], bool]
    """Whether a job or array id names a job the master knows (for `--dependency`)."""
    groups: Callable[[str], set[str]]
    """A user's Unix groups on the master's machine."""


class Admission:
    def __init__(self, config: AdmissionConfig, max_gpus_per_user: int | None = None) -> None:
        self.config = config
        self.max_gpus_per_user = max_gpus_per_user
        self.max_time = (
            specs.parse_time_limit(config.max_time_per_job) if config.max_time_per_job else None
        )
        self._verdicts_for: Sequence[NodeView] | None = None
        self._verdicts: dict[tuple[object, ...], str | None] = {}
        self.asks: AskRules | None = None
        """The cluster's CPU and memory rules (defaults and `max_mem_per_cpu` per
        partition), already in each job's request (`request_for`); None: none."""

    async def admit(self, jobs: Sequence[Job], spec: JobSpec, ctx: AdmissionContext) -> None:
        """Apply the mutators to every job, then the validators; raise SubmitError."""
        self.mutate(jobs, spec)
        groups = self.check(jobs[0], spec, ctx)
        if self.config.validator:
            await self.run_validator(jobs[0], spec, groups or ctx.groups(jobs[0].user))

    # ---- mutators -------------------------------------------------------------------

    def mutate(self, jobs: Sequence[Job], spec: JobSpec) -> None:
        """Defaults the site sets: MaxTime is also the limit of a job without `--time`
        (as Slurm's MaxTime), unless `scheduling.default_time_limit` gave it one."""
        if self.max_time is not None and spec.time is None:
            for job in jobs:
                if job.time_limit is None:
                    job.time_limit = self.max_time

    # ---- validators -----------------------------------------------------------------

    def check(self, job: Job, spec: JobSpec, ctx: AdmissionContext) -> set[str] | None:
        """The validators that answer at once, cheapest first.  Returns the user's groups
        when they had to be looked up (the external validator gets them too)."""
        c = self.config
        groups: set[str] | None = None
        if c.allowed_users or c.allowed_groups:
            groups = ctx.groups(job.user)
            if job.user not in c.allowed_users and not groups & set(c.allowed_groups):
                raise SubmitError(
                    f"user {job.user} may not submit jobs to this cluster "
                    "(not in site.admission's allowed users or groups)"
                )
        if c.max_gpus_per_job is not None and job.gpus > c.max_gpus_per_job:
            raise SubmitError(
                f"the job asks for {_plural(job.gpus, 'GPU')} but this cluster allows at most "
                f"{c.max_gpus_per_job} per job"
            )
        nodes_asked = job.nodes or (len(job.node_gpu_ids) if job.node_gpu_ids else 1)
        if c.max_nodes_per_job is not None and nodes_asked > c.max_nodes_per_job:
            raise SubmitError(
                f"the job asks for {_plural(nodes_asked, 'node')} but this cluster allows at "
                f"most {c.max_nodes_per_job} per job"
            )
        if self.max_time is not None:
            limit = specs.format_time_limit(self.max_time)
            if spec.time is not None and math.isinf(spec.time):
                raise SubmitError(
                    f"the job asks for no time limit but this cluster allows at most "
                    f"{limit} per job"
                )
            if job.time_limit is not None and job.time_limit > self.max_time:
                raise SubmitError(
                    f"the job's time limit {specs.format_time_limit(job.time_limit)} is more "
                    f"than this cluster allows per job ({limit})"
                )
        cap = self.max_gpus_per_user
        if cap is not None and job.gpus > cap:
            raise SubmitError(
                f"the job asks for {job.gpus} GPUs but a user may hold at most {cap} "
                "(scheduling.max_gpus_per_user)"
            )
        for kind, dep_id in job.dependency:
            if not ctx.job_exists(dep_id):
                raise SubmitError(f"--dependency {kind}:{dep_id} names no known job")
        why = self.never_fits(job, ctx.nodes, ctx.request_for)
        if why is not None:
            raise SubmitError(why)
        return groups

    def never_fits(
        self, job: Job, nodes: Sequence[NodeView], request_for: Callable[[Job], JobRequest]
    ) -> str | None:
        """Why `job` could never run on `nodes` (one sentence), or None.  Before any node
        is known there is nothing to judge against: None (the master judges the job again
        once nodes have joined)."""
        if not nodes:
            return None
        if job.image is not None and not any(CONTAINER_FEATURE in n.features for n in nodes):
            return (
                "no node has a container runtime (podman, docker or apptainer) "
                f"to run --image {job.image}"
            )
        request = request_for(job)
        # The verdict depends on the request's shape and the nodes' alone: remembered for
        # as long as the caller passes the same node list (master/state/nodeindex.py keeps one
        # until the cluster's shape changes), so a submit does not cost O(nodes).
        if nodes is not self._verdicts_for or len(self._verdicts) > 4096:
            self._verdicts_for, self._verdicts = nodes, {}
        user = request.user if request.allowed_nodes is not None else None
        key = (*shape_key(request), user, request.ask)
        if key not in self._verdicts:
            self._verdicts[key] = could_ever_fit(request, nodes)
        return self._verdicts[key]

    # ---- the site's external validator ----------------------------------------------

    @staticmethod
    def job_spec(job: Job, spec: JobSpec, groups: set[str]) -> dict[str, Any]:
        """What the validator reads on stdin."""
        return {
            "user": job.user,
            "groups": sorted(groups),
            "name": job.name,
            "command": job.command,
            "argv": list(job.argv),
            "gpus": job.gpus,
            "nodes": job.nodes,
            "gpus_per_node": job.gpus_per_node,
            "gpu_ids": job.gpu_ids,
            "node_gpu_ids": (
                None if job.node_gpu_ids is None else {n: g for n, g in job.node_gpu_ids}
            ),
            "nodelist": job.nodelist,
            "exclude": job.exclude,
            "gpu_type": job.gpu_type,
            "time_limit": (
                None if job.time_limit is None or math.isinf(job.time_limit) else job.time_limit
            ),
            "priority": job.priority,
            "max_retries": job.max_retries,
            "preemptible": job.preemptible,
            "distributed": job.distributed,
            "mpi": job.mpi,
            "interactive": job.interactive,
            "array": None if spec.array is None else specs.format_array(spec.array),
            "dependency": [f"{k}:{j}" for k, j in job.dependency],
            "image": job.image,
            "cwd": job.cwd,
        }

    async def run_validator(self, job: Job, spec: JobSpec, groups: set[str]) -> None:
        """Run the site's validator on `job`; raise SubmitError if it refuses or fails."""
        c = self.config
        assert c.validator is not None
        payload = json.dumps(self.job_spec(job, spec, groups)).encode()
        code, out, err = await _run(c.validator, payload, c.validator_timeout)
        if code is None:
            raise SubmitError(
                f"the site's job validator did not answer within {c.validator_timeout:g} s"
            )
        if code == 0:
            return
        line = _first_line(out) or _first_line(err)
        if code == 127 and not out.strip():
            raise SubmitError(f"the site's job validator cannot run: {line or 'not found'}")
        raise SubmitError(
            f"refused by the site's job validator: {line}"
            if line
            else f"refused by the site's job validator (exit code {code})"
        )


async def _run(command: str, stdin: bytes, timeout: float) -> tuple[int | None, str, str]:
    """Run `command` with `/bin/sh -c` in its own process group: (exit code, stdout,
    stderr), the code None if it did not end within `timeout` (then the group is killed)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as e:
        raise SubmitError(f"the site's job validator cannot run: {e.strerror or e}") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except TimeoutError:
        _kill_group(proc.pid)
        with contextlib.suppress(TimeoutError):  # its pipes closed and its exit reaped
            await asyncio.wait_for(proc.communicate(), 5)
        return None, "", ""
    except BaseException:  # the request was cancelled
        _kill_group(proc.pid)
        raise
    code = proc.returncode
    assert code is not None
    return code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _first_line(text: str) -> str:
    line = next((x.strip() for x in text.splitlines() if x.strip()), "")
    line = "".join(ch if ch.isprintable() else " " for ch in line)
    return line if len(line) <= MAX_REASON_CHARS else line[: MAX_REASON_CHARS - 3] + "..."


__all__ = ["CONTAINER_FEATURE", "Admission", "AdmissionContext"]
