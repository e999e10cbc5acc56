"""A job's Pod: the `Launch` an agent would get, made into a core/v1 Pod.  Pure.

The partition's `pod_template` (a Pod fragment: metadata, spec; or a bare PodSpec) gives
what the site decides: the image, volumes and their mounts, the working directory, pull
secrets, service account, tolerations, init containers.  mgpu sets what is the job's, and
nothing in the template overrides it:

* the container `job` (the template's first container is its base; others are dropped: a
  sidecar that never ends would keep the job running): the command or batch script, the
  job's environment (SLURM_*/MGPU_* from mgpu.master.control.launch), its GPUs as
  `gpu_resource` limits, its CPUs and memory as requests and limits;
* its user: runAsUser/runAsGroup of the job's user, never privileged, no privilege
  escalation;
* restartPolicy Never, the job's kill grace as terminationGracePeriodSeconds, no
  service-account token unless the template asks for one; one process namespace for the
  Pod (`shareProcessNamespace`), so that the job is not pid 1 (which gets only the
  signals it traps) and dies of a SIGTERM or a `scancel --signal` as on Slurm;
* where: the kube-scheduler places the Pod.  mgpu's own pick is only a preference
  (preferred node affinity), so that its ledger usually matches; `nodeName` is set only
  when the user pinned nodes.  A job's Pods are spread one per Node (anti-affinity), as
  its slots are;
* labels (the job, its run's epoch and rank, the cluster) and annotations (the exact job
  id, the slot's node, the master's generation), by which a restarted master finds them;
* a job on several Pods: each knows its own address (`MGPU_POD_IP`, the downward API), and
  the rendezvous (`MASTER_ADDR`, `PET_MASTER_ADDR`) names the rank-0 Pod's address, not its
  Node's: rank 0's is its own (`$(MGPU_POD_IP)`), the others' is given by the driver once
  rank 0's Pod has one (mgpu.master.kube.gang).
"""

from __future__ import annotations

import copy
import posixpath
import re
from dataclasses import dataclass
from typing import Any

from mgpu.kubesection import KubernetesSection
from mgpu.master.kube.podoutput import runner
from mgpu.master.kube.podsteps import pod_agent_env, with_pod_agent
from mgpu.protocol import Launch

__all__ = [
    "ANN_GENERATION",
    "ANN_HOLDS",
    "ANN_JOB",
    "ANN_NODE",
    "CONTAINER",
    "LABEL_CLUSTER",
    "LABEL_EPOCH",
    "LABEL_JOB",
    "LABEL_RANK",
    "PodShape",
    "build_pod",
    "keep_private",
    "label_value",
    "pod_name",
    "template_parts",
]

LABEL_CLUSTER = "mgpu.io/cluster"
LABEL_JOB = "mgpu.io/job"
LABEL_EPOCH = "mgpu.io/epoch"
LABEL_RANK = "mgpu.io/rank"
ANN_JOB = "mgpu.io/job-id"
ANN_NODE = "mgpu.io/node"
ANN_GENERATION = "mgpu.io/generation"
ANN_HOLDS = "mgpu.io/holds"
"""On a Pod that only holds a batch job's slot (mgpu.master.kube.gang)."""
POD_IP = "MGPU_POD_IP"
RENDEZVOUS_ADDRESS = ("MASTER_ADDR", "PET_MASTER_ADDR")
CONTAINER = "job"
SCRIPT_VARIABLE = "MGPU_BATCH_SCRIPT"
# The batch script travels in the Pod's environment, from the Pod's Secret (`keep_private`),
# is written to a private file by the job's own user and run with its #! interpreter. Its
# stderr is its stdout: the runtime reads a container's two streams apart, so a line on
# one could reach the Pod's log (one stream to read) before an earlier one on the other.
PRIVATE_ENV = ("MGPU_TOKEN", SCRIPT_VARIABLE)
"""What of a job's environment is its own: its credential (it acts as the job's user) and
its batch script.  Kept in a Secret, not in the Pod's spec that every reader of the
namespace's Pods sees."""
SCRIPT_RUNNER = (
    'f=$(mktemp) && printf "%s" "$MGPU_BATCH_SCRIPT" > "$f" && chmod 700 "$f" '
    '&& unset MGPU_BATCH_SCRIPT && exec "$f" "$@" 2>&1'
)


def label_value(text: str) -> str:
    """`text` as a label value: at most 63 of [A-Za-z0-9_.-], alphanumeric at both ends."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63].strip("-_.")
    return value or "x"


def pod_name(cluster: str, job_id: str, epoch: int, rank: int) -> str:
    """A DNS-1123 name of one run's Pod: `mgpu-CLUSTER-JOB-EPOCH-RANK`."""
    base = re.sub(r"[^a-z0-9-]", "-", f"mgpu-{cluster}-{job_id}".lower())
    suffix = f"-{epoch}-{rank}"
    return re.sub(r"-+", "-", base)[: 63 - len(suffix)].rstrip("-") + suffix


def template_parts(template: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The template's metadata and spec (a bare PodSpec is a spec)."""
    if "spec" in template or "metadata" in template:
        return dict(template.get("metadata") or {}), dict(template.get("spec") or {})
    return {}, dict(template)


@dataclass(frozen=True)
class PodShape:
    """What the Pod of one rank is, beyond its Launch."""

    cluster: str
    rank: int
    slot_node: str
    """mgpu's pick: preferred, or `nodeName` with `pinned`."""
    pinned: bool
    gang: int
    """The job's number of Pods (anti-affinity between them when more than one)."""
    gpus: int
    uid: int
    gid: int
    generation: int | None = None
    master_addr: str | None = None
    """The rank-0 Pod's address, for the rendezvous of rank > 0 of a gang."""
    node_addr: str = ""
    """The rank-0 Node's address, which mgpu's rendezvous variables name."""
    holds: bool = False
    """The Pod holds a batch job's slot and runs nothing of the job's."""


def _on_volume(cwd: str | None, container: dict[str, Any]) -> bool:
    """Whether a template volume mounts the job's directory."""
    for mount in container.get("volumeMounts") or [] if cwd else []:
        path = str(mount.get("mountPath") or "")
        if cwd and path and (cwd == path or cwd.startswith(path.rstrip("/") + "/")):
            return True
    return False


def _working_dir(cwd: str | None, container: dict[str, Any]) -> str | None:
    """The job's directory where the template mounts it (a volume holds it), else the
    template's own working directory."""
    if cwd and _on_volume(cwd, container):
        return posixpath.normpath(cwd)
    wd = container.get("workingDir")
    return str(wd) if wd else None


def _command(launch: Launch, files: bool) -> tuple[list[str], dict[str, str]]:
    """The container's command and what it adds to the environment; `files`: the -o/-e
    files are written (the job's directory is on a volume: they outlive the Pod)."""
    if launch.script is not None:
        name = launch.script_name or "script"
        if files and launch.output_file is not None:  # mgpu.master.kube.podoutput
            error = launch.error_file or launch.output_file
            argv = runner(name, launch.output_file, error, launch.open_append, launch.argv)
            return argv, {SCRIPT_VARIABLE: launch.script}
        return ["/bin/sh", "-c", SCRIPT_RUNNER, name, *launch.argv], {
            SCRIPT_VARIABLE: launch.script
        }
    return list(launch.argv), {}


def _gpu_env(launch: Launch, gpus: int) -> dict[str, str]:
    """The GPU variables mgpu's agent would set: the device plugin gives the container
    its GPUs, numbered from 0 inside it, so these name them so."""
    if not gpus:
        return {}
    ids = ",".join(str(i) for i in range(gpus))
    env = {"MGPU_GPU_IDS": ids}
    if launch.grant.slurm:
        env.update({"SLURM_JOB_GPUS": ids, "SLURM_GPUS_ON_NODE": str(gpus)})
    return env


def _resources(launch: Launch, section: KubernetesSection, gpus: int) -> dict[str, Any]:
    wanted: dict[str, str] = {}
    if launch.grant.cpus:
        wanted["cpu"] = str(len(launch.grant.cpus))
    if launch.grant.mem_mb:
        wanted["memory"] = f"{launch.grant.mem_mb}Mi"
    limits = dict(wanted)
    if gpus:
        limits[section.gpu_resource] = str(gpus)
    return {"requests": wanted, "limits": limits} if wanted else {"limits": limits}


def _affinity(shape: PodShape, job_label: str) -> dict[str, Any]:
    hostname = {"key": "kubernetes.io/hostname", "operator": "In", "values": [shape.slot_node]}
    affinity: dict[str, Any] = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "preference": {"matchExpressions": [hostname]}}
            ]
        }
    }
    if shape.gang > 1:
        selector = {
            "matchLabels": {LABEL_CLUSTER: label_value(shape.cluster), LABEL_JOB: job_label}
        }
        affinity["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": selector, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    return affinity


def build_pod(launch: Launch, section: KubernetesSection, shape: PodShape) -> dict[str, Any]:
    """The Pod of one rank of a job's run (see the module's text)."""
    meta_t, spec = template_parts(copy.deepcopy(section.pod_template))
    containers = list(spec.get("containers") or [{}])
    container = dict(containers[0])
    command, extra_env = _command(launch, files=_on_volume(launch.cwd, container))
    env_t = [e for e in container.get("env") or [] if isinstance(e, dict)]
    job_env = {**launch.env, **_gpu_env(launch, shape.gpus), **extra_env}
    env: list[dict[str, Any]] = []
    if shape.gang > 1:
        job_env.update(_rendezvous(job_env, shape))
        env.append({"name": POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    env += [e for e in env_t if e.get("name") not in job_env and e.get("name") != POD_IP]
    env += [{"name": k, "value": v} for k, v in job_env.items()]
    if section.steps is not None:  # the pod agent beside the job (mgpu.master.kube.podsteps)
        command = with_pod_agent(command)
        agent_env = pod_agent_env(section.steps)
        ours = {e["name"] for e in agent_env}
        env = agent_env + [e for e in env if e.get("name") not in ours]
    container.update(
        {
            "name": CONTAINER,
            "image": launch.image or container.get("image") or section.image,
            "command": command,
            "env": env,
            "resources": _resources(launch, section, shape.gpus),
            # where `mgpu pod-init` says how the job ended (mgpu.podagent.init)
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
            "securityContext": {
                **(container.get("securityContext") or {}),
                "runAsUser": shape.uid,
                "runAsGroup": shape.gid,
                "runAsNonRoot": shape.uid != 0,
                "privileged": False,
                "allowPrivilegeEscalation": False,
            },
        }
    )
    container.pop("args", None)
    workdir = _working_dir(launch.cwd, container)
    if workdir:
        container["workingDir"] = workdir
    spec.update(
        {
            "containers": [container],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": max(1, round(launch.kill_grace)),
            "affinity": {**(spec.get("affinity") or {}), **_affinity(shape, _job_label(launch))},
        }
    )
    # The job is not its container's pid 1 (the Pod's pause is): Linux gives pid 1 only
    # the signals it traps, so a script that traps nothing ignored its deletion's SIGTERM
    # (a cancel waited the whole grace) and `scancel --signal`.
    spec["shareProcessNamespace"] = True
    spec.setdefault("automountServiceAccountToken", False)
    spec["securityContext"] = {
        **(spec.get("securityContext") or {}),
        "runAsUser": shape.uid,
        "runAsGroup": shape.gid,
    }
    if shape.pinned:
        spec["nodeName"] = shape.slot_node
    labels = {
        **(meta_t.get("labels") or {}),
        LABEL_CLUSTER: label_value(shape.cluster),
        LABEL_JOB: _job_label(launch),
        LABEL_EPOCH: str(launch.epoch),
        LABEL_RANK: str(shape.rank),
    }
    annotations = {
        **(meta_t.get("annotations") or {}),
        ANN_JOB: launch.job_id,
        ANN_NODE: shape.slot_node,
    }
    if shape.generation is not None:
        annotations[ANN_GENERATION] = str(shape.generation)
    if shape.holds:
        annotations[ANN_HOLDS] = "true"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(shape.cluster, launch.job_id, launch.epoch, shape.rank),
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    }


def _rendezvous(env: dict[str, str], shape: PodShape) -> dict[str, str]:
    """The rendezvous of a gang at the rank-0 Pod: a Node's address would not reach a
    process in a Pod.  Only the variables mgpu set are changed (a Slurm job's own stand:
    they are absent unless it asked, `--distributed`, or name another address)."""
    where = f"$({POD_IP})" if shape.rank == 0 else shape.master_addr
    if where is None:
        return {}
    return {k: where for k in RENDEZVOUS_ADDRESS if k in env and env[k] == shape.node_addr}


def _job_label(launch: Launch) -> str:
    return label_value(launch.job_id)


def keep_private(pod: dict[str, Any]) -> dict[str, Any] | None:
    """Moves the job's credential and batch script (PRIVATE_ENV) out of `pod`'s spec into
    a Secret of the Pod's name, which its container's environment refers to; the Secret
    (None: nothing private).  It is made before the Pod and owned by it once the Pod is
    made (mgpu.master.kube.pods), so Kubernetes deletes it with the Pod."""
    meta = pod["metadata"]
    name = meta["name"]
    data: dict[str, str] = {}
    for container in pod["spec"]["containers"]:
        env = []
        for e in container.get("env") or []:
            if e.get("name") in PRIVATE_ENV and "value" in e:
                data[e["name"]] = e["value"]
                e = {
                    "name": e["name"],
                    "valueFrom": {"secretKeyRef": {"name": name, "key": e["name"]}},
                }
            env.append(e)
        container["env"] = env
    if not data:
        return None
    labels = {k: v for k, v in meta["labels"].items() if k.startswith("mgpu.io/")}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {ANN_JOB: meta["annotations"][ANN_JOB]},
        },
        "stringData": data,
    }
