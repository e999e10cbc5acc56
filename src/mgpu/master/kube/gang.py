"""A job on several Pods: its holders and its rendezvous.

* **Holders.**  A batch job (or an MPI job) on N nodes runs its script on rank 0; on
  mgpu's own nodes its other slots are held in the master's ledger for the script's steps.
  On Kubernetes a hold in mgpu's ledger alone is no hold: another workload's Pod could be
  bound to those GPUs.  So each held slot gets a Pod too, that requests the slot's GPUs,
  CPUs and memory and runs nothing of the job's (it waits to be deleted): Kubernetes holds
  what mgpu's ledger holds, and the job is all its Pods or none (one held Pod unplaced
  sends the whole job back).  It is deleted when the job's run ends.  Where the partition
  runs steps (`kubernetes.steps`), its pod agent runs the job's steps sent to its node.
* **Rendezvous.**  A Node's address does not reach a process in a Pod: the gang meets at
  its rank-0 Pod's address.  Rank 0 names its own (`$(MGPU_POD_IP)`, the downward API);
  the Pods of the other ranks are made once rank 0's Pod has an address (the kubelet gives
  it when the Pod's sandbox is up, before its container starts), with that address in
  `MASTER_ADDR`/`PET_MASTER_ADDR`.  No Service, no DNS: nothing more of Kubernetes than
  Pods is needed (nor more RBAC).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from mgpu.master.control.launch import grant
from mgpu.master.kube.runs import PodRun
from mgpu.master.state.registry import NodeRecord
from mgpu.model import Job
from mgpu.protocol import Launch

__all__ = ["HOLD_COMMAND", "first_pod_ip", "holder_launch"]

HOLD_COMMAND = [
    "/bin/sh",
    "-c",
    "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done",
]
"""A held slot's Pod waits to be deleted (and ends at once on its SIGTERM)."""
POLL = 0.25


def holder_launch(
    launch: Launch,
    job: Job,
    rank: int,
    nodes: Mapping[str, NodeRecord],
    credential: str | None = None,
) -> Launch:
    """The Pod of held slot `rank`, from the job's rank-0 launch: that slot's GPUs, CPUs
    and memory; nothing of the job's command or script.  `credential`: the job's, for the
    Pod's agent of the job's steps (mgpu.podagent), when the partition runs steps."""
    slot = job.allocation[rank]
    env = {"MGPU_JOB_ID": job.id, "MGPU_NODE_RANK": str(rank), "MGPU_HOLDS": "1"}
    if credential is not None:
        env["MGPU_TOKEN"] = credential
    return launch.model_copy(
        update={
            "argv": list(HOLD_COMMAND),
            "env": env,
            "script": None,
            "script_name": None,
            "grant": grant(job, slot, nodes),
            "time_limit": None,
        }
    )


async def first_pod_ip(rank0: Callable[[], PodRun | None], alive: Callable[[], bool]) -> str | None:
    """The rank-0 Pod's address once it has one; None once the run is over (sent back,
    failed, cancelled, or rank 0 ended without one: the caller makes no Pod).  Rank 0's
    run, once seen, is kept: a quick rank 0 may have ended and left the runs, its address
    still the gang's."""
    seen: PodRun | None = None
    while alive():
        seen = rank0() or seen
        if seen is not None and seen.ip:
            return seen.ip
        if seen is not None and (seen.ended or seen.gone):
            return None
        await asyncio.sleep(POLL)
    return None
