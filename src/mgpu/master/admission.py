"""Admission control: the site's rules a job must meet to be queued at all.

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

`Cluster._build_jobs` calls `Admission.check` on every submission, before the job can
be queued.  A refusal is a `SubmitError` with one sentence for the user; the master
answers 400 and records a `submit_refused` audit event; nothing is queued.

The validator (the seeds' `job_validator.sh`) is run with `/bin/sh -c` and gets the job
as JSON on stdin (`user`, `groups`, `command`, `argv`, `gpus`, `nodes`, `time_limit`,
`image`, ...).  Exit 0 accepts; anything else refuses, the first line it printed being
the reason.  A validator that does not answer within `validator_timeout` seconds, or
cannot be run, refuses the job (fail closed).  It runs inside the submit request, as
Slurm's job_submit plugins do, so it should answer in milliseconds.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections.abc import Sequence
from typing import Any

from mgpu import spec as specs
from mgpu.config import Admission as AdmissionConfig
from mgpu.model import Job
from mgpu.scheduler.types import NodeView

_IMAGE = re.compile(r"^[A-Za-z0-9_./:@+=~-]{1,512}$")
"""Image names and .sif paths: no whitespace, no shell or option syntax."""

CONTAINER_FEATURE = "container"


def _refuse(message: str) -> Exception:
    from mgpu.master.cluster import SubmitError

    return SubmitError(message)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class Admission:
    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self.max_time = (
            specs.parse_time_limit(config.max_time_per_job) if config.max_time_per_job else None
        )

    def check(self, job: Job, req: dict[str, Any], nodes: Sequence[NodeView]) -> None:
        """Raise SubmitError when the site's rules refuse `job`; may set its time limit."""
        c = self.config
        groups: set[str] | None = None
        if c.allowed_users or c.allowed_groups:
            groups = self._groups(job.user)
            if job.user not in c.allowed_users and not groups & set(c.allowed_groups):
                raise _refuse(
                    f"user {job.user} may not submit jobs to this cluster "
                    "(not in site.admission's allowed users or groups)"
                )
        if c.max_gpus_per_job is not None and job.gpus > c.max_gpus_per_job:
            raise _refuse(
                f"the job asks for {_plural(job.gpus, 'GPU')} but this cluster allows at most "
                f"{c.max_gpus_per_job} per job"
            )
        nodes_asked = job.nodes or (len(job.node_gpu_ids) if job.node_gpu_ids else 1)
        if c.max_nodes_per_job is not None and nodes_asked > c.max_nodes_per_job:
            raise _refuse(
                f"the job asks for {_plural(nodes_asked, 'node')} but this cluster allows at "
                f"most {c.max_nodes_per_job} per job"
            )
        if self.max_time is not None:
            limit = specs.format_time_limit(self.max_time)
            if job.time_limit is None:
                if str(req.get("time") or "").strip():  # an explicit UNLIMITED
                    raise _refuse(
                        f"the job asks for no time limit but this cluster allows at most "
                        f"{limit} per job"
                    )
                job.time_limit = self.max_time  # as Slurm's MaxTime: the default too
            elif job.time_limit > self.max_time:
                raise _refuse(
                    f"the job's time limit {specs.format_time_limit(job.time_limit)} is more "
                    f"than this cluster allows per job ({limit})"
                )
        if job.image is not None:
            self._check_image(job.image, nodes)
        if c.validator:
            if groups is None:
                groups = self._groups(job.user)
            self._validate(job, req, groups)

    def _check_image(self, image: str, nodes: Sequence[NodeView]) -> None:
        if not _IMAGE.match(image) or image.startswith("-"):
            raise _refuse(f"--image {image!r} is not a valid image name or .sif path")
        if nodes and not any(CONTAINER_FEATURE in n.features for n in nodes):
            raise _refuse(
                "no node has a container runtime (podman, docker or apptainer) "
                f"to run --image {image}"
            )

    @staticmethod
    def _groups(user: str) -> set[str]:
        from mgpu.master.cluster import _unix_groups

        return _unix_groups(user)

    @staticmethod
    def job_spec(job: Job, req: dict[str, Any], groups: set[str]) -> dict[str, Any]:
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
            "array": req.get("array"),
            "dependency": [f"{k}:{j}" for k, j in job.dependency],
            "image": job.image,
            "cwd": job.cwd,
        }

    def _validate(self, job: Job, req: dict[str, Any], groups: set[str]) -> None:
        c = self.config
        assert c.validator is not None
        payload = json.dumps(self.job_spec(job, req, groups))
        try:
            res = subprocess.run(
                ["/bin/sh", "-c", c.validator],
                input=payload,
                capture_output=True,
                text=True,
                timeout=c.validator_timeout,
            )
        except subprocess.TimeoutExpired:
            raise _refuse(
                f"the site's job validator did not answer within {c.validator_timeout:g} s"
            ) from None
        except OSError as e:
            raise _refuse(f"the site's job validator cannot run: {e.strerror or e}") from None
        if res.returncode == 0:
            return
        line = next((x.strip() for x in res.stdout.splitlines() if x.strip()), "")
        if not line:
            line = next((x.strip() for x in res.stderr.splitlines() if x.strip()), "")
        if res.returncode == 127 and not res.stdout.strip():
            raise _refuse(f"the site's job validator cannot run: {line or 'not found'}")
        raise _refuse(
            f"refused by the site's job validator: {line}"
            if line
            else f"refused by the site's job validator (exit code {res.returncode})"
        )


__all__ = ["Admission"]
