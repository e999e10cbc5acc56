"""The pure parts of a Kubernetes-backed partition (mgpu.master.kube): the Pod a launch
becomes, what a Node offers and what others hold of it, which nodes a job may use, and
the config's words.  The whole, against a real Kubernetes: tests/k8s/test_kube_partition.py."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from mgpu.config import ClusterConfig, ConfigError, load_config
from mgpu.kube import NodeView, PodView
from mgpu.kube.objects import Taint
from mgpu.kubesection import KubernetesSection
from mgpu.master.http.partitions import partitions_public
from mgpu.master.kube.capacity import blocked_cpus, blocked_gpus, offer, others_on, tolerated
from mgpu.master.kube.gang import HOLD_COMMAND, holder_launch
from mgpu.master.kube.podspec import PodShape, build_pod, pod_name
from mgpu.master.state.partscope import kube_refused, partition_scope, scoped
from mgpu.model import Job, Slot
from mgpu.protocol import Grant, Launch
from mgpu.scheduler import JobRequest
from mgpu.slurmoptions import SlurmOptions

TEMPLATE = {
    "metadata": {"labels": {"team": "vision", "mgpu.io/job": "forged"}},
    "spec": {
        "serviceAccountName": "trainer",
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "volumes": [{"name": "nas", "nfs": {"server": "nas", "path": "/home"}}],
        "containers": [
            {
                "name": "main",
                "image": "site/pytorch:1",
                "workingDir": "/work",
                "volumeMounts": [{"name": "nas", "mountPath": "/home"}],
                "env": [{"name": "SITE", "value": "1"}, {"name": "MGPU_JOB_ID", "value": "x"}],
                "securityContext": {"privileged": True, "runAsUser": 0},
                "args": ["--ignored"],
            },
            {"name": "sidecar", "image": "site/logger:1"},
        ],
    },
}


def _shape(**kw: Any) -> PodShape:
    base: dict[str, Any] = dict(
        cluster="lab", rank=0, slot_node="n1", pinned=False, gang=1, gpus=2, uid=1000, gid=100
    )
    return PodShape(**{**base, **kw})


def _launch(**kw: Any) -> Launch:
    base: dict[str, Any] = dict(
        job_id="42", epoch=3, argv=["python", "train.py"], env={"MGPU_JOB_ID": "42"},
        grant=Grant(gpus=[0, 1], cpus=[0, 1, 2, 3], mem_mb=8192, slurm=True),
        cwd="/home/ann/run", kill_grace=7.0,
    )  # fmt: skip
    return Launch(**{**base, **kw})


def test_a_launch_becomes_its_pod() -> None:
    section = KubernetesSection(pod_template=TEMPLATE)
    pod = build_pod(_launch(), section, _shape())
    spec, meta = pod["spec"], pod["metadata"]
    assert meta["name"] == "mgpu-lab-42-3-0"
    assert meta["labels"] == {
        "team": "vision",
        "mgpu.io/job": "42",  # mgpu's, whatever the template says
        "mgpu.io/cluster": "lab",
        "mgpu.io/epoch": "3",
        "mgpu.io/rank": "0",
    }
    assert meta["annotations"] == {"mgpu.io/job-id": "42", "mgpu.io/node": "n1"}
    [container] = spec["containers"]  # the sidecar would keep the job from ending
    assert container["name"] == "job" and container["image"] == "site/pytorch:1"
    assert container["command"] == ["python", "train.py"] and "args" not in container
    assert container["workingDir"] == "/home/ann/run"  # under the template's mount
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["MGPU_JOB_ID"] == "42" and env["SITE"] == "1"
    assert env["SLURM_GPUS_ON_NODE"] == "2" and env["MGPU_GPU_IDS"] == "0,1"
    assert container["resources"] == {
        "requests": {"cpu": "4", "memory": "8192Mi"},
        "limits": {"cpu": "4", "memory": "8192Mi", "nvidia.com/gpu": "2"},
    }
    security = container["securityContext"]
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert (security["runAsUser"], security["runAsGroup"], security["runAsNonRoot"]) == (
        1000,
        100,
        True,
    )
    assert spec["securityContext"] == {"runAsUser": 1000, "runAsGroup": 100}
    assert spec["restartPolicy"] == "Never" and spec["terminationGracePeriodSeconds"] == 7
    assert spec["automountServiceAccountToken"] is False
    assert spec["shareProcessNamespace"] is True  # the job is not pid 1: signals reach it
    assert spec["serviceAccountName"] == "trainer" and spec["tolerations"]
    assert "nodeName" not in spec  # the kube-scheduler places it; mgpu's pick is preferred
    preferred = spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred[0]["preference"]["matchExpressions"][0]["values"] == ["n1"]
    assert "podAntiAffinity" not in spec["affinity"]


def test_a_pinned_job_is_bound_and_a_gang_is_spread() -> None:
    section = KubernetesSection(image="busybox:1")
    pod = build_pod(_launch(cwd="/elsewhere"), section, _shape(pinned=True, gang=2, rank=1))
    assert pod["spec"]["nodeName"] == "n1"
    assert pod["spec"]["containers"][0]["image"] == "busybox:1"
    assert "workingDir" not in pod["spec"]["containers"][0]  # no volume holds /elsewhere
    anti = pod["spec"]["affinity"]["podAntiAffinity"]
    rule = anti["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert rule["labelSelector"]["matchLabels"] == {"mgpu.io/cluster": "lab", "mgpu.io/job": "42"}


def test_a_batch_script_travels_in_the_environment() -> None:
    launch = _launch(script="#!/bin/sh\necho hi\n", script_name="job.sh", argv=["a"])
    pod = build_pod(launch, KubernetesSection(image="b:1"), _shape(gpus=0))
    container = pod["spec"]["containers"][0]
    assert container["command"][:2] == ["/bin/sh", "-c"]
    assert container["command"][3:] == ["job.sh", "a"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["MGPU_BATCH_SCRIPT"] == "#!/bin/sh\necho hi\n" and "MGPU_GPU_IDS" not in env
    assert container["resources"]["limits"] == {"cpu": "4", "memory": "8192Mi"}


def test_pod_names_are_dns_names() -> None:
    assert pod_name("My_Lab", "12_345", 1, 0) == "mgpu-my-lab-12-345-1-0"
    assert len(pod_name("x" * 80, "1", 10, 3)) <= 63


def _node(gpus: int = 4) -> NodeView:
    alloc = {"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": str(gpus), "pods": "110"}
    return NodeView.of(
        {"metadata": {"name": "n1"}, "status": {"allocatable": alloc, "conditions": []}}
    )


def _pod(name: str, gpus: int, cpu: str = "1", phase: str = "Running", **meta: Any) -> PodView:
    limits = {"nvidia.com/gpu": gpus, "cpu": cpu, "memory": "1Gi"}
    return PodView.of(
        {
            "metadata": {"name": name, "namespace": "ns", **meta},
            "spec": {"nodeName": "n1", "containers": [{"resources": {"limits": limits}}]},
            "status": {"phase": phase},
        }
    )


def test_what_a_node_offers_and_what_others_hold() -> None:
    got = offer(_node(), "nvidia.com/gpu")
    assert [g.index for g in got.gpus] == [0, 1, 2, 3]
    assert len(got.cpus) == 8 and got.mem_mb == 16384
    pods = [
        _pod("theirs", 2, cpu="1500m"),
        _pod("ended", 1, phase="Succeeded"),  # Kubernetes no longer counts it
        _pod("terminating", 1, phase="Succeeded", deletionTimestamp="t"),  # it still does
        _pod("ours", 1),
    ]
    others = others_on(pods, "nvidia.com/gpu", lambda p: p.name == "ours")
    assert (others.gpus, others.cpus, others.mem_mb) == (3, 3, 2048)
    assert [p["name"] for p in others.pods] == ["ns/terminating", "ns/theirs"]
    assert others.pods[0]["phase"] == "Terminating"
    assert blocked_gpus(range(4), {3: "job"}, 2) == frozenset({2, 1})
    assert blocked_gpus(range(4), {3: "job"}, 9) == frozenset({0, 1, 2})
    assert blocked_cpus(range(4), {3: "job", 1: "kubernetes:others"}, 2) == [2, 1]


def test_taints_the_template_tolerates() -> None:
    gpu = Taint("gpu", "", "NoSchedule")
    assert not tolerated([gpu], [])
    assert tolerated([gpu], [{"key": "gpu", "operator": "Exists"}])
    assert tolerated([Taint("x", "", "PreferNoSchedule")], [])
    assert not tolerated([gpu], [{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}])
    assert tolerated([Taint("a", "b", "NoExecute")], [{"key": "a", "value": "b"}])


def _config(default: str = "k8s") -> ClusterConfig:
    return ClusterConfig.model_validate(
        {
            "partitions": [
                {"name": "own", "default": default == "own"},
                {"name": "k8s", "default": default == "k8s", "kubernetes": {}},
            ]
        }
    )


def _job(partition: str | None) -> Job:
    slurm = None if partition is None else SlurmOptions(partition=partition)
    return Job(id="1", user="u", argv=["true"], command="true", slurm=slurm)


def _request(exclude: frozenset[str] = frozenset()) -> JobRequest:
    return JobRequest(job_id="1", user="u", submit_time=0.0, gpus=1, exclude=exclude)


def test_a_kubernetes_partitions_nodes_are_its_own() -> None:
    scope = partition_scope(_config())
    assert scope is not None and partition_scope(ClusterConfig()) is None
    kube = {"k1": "k8s", "k2": "k8s"}
    mine = scoped(_request(), _job("k8s"), kube, scope)
    assert mine.allowed_nodes == frozenset({"k1", "k2"})
    assert scoped(_request(), _job(None), kube, scope).allowed_nodes == {"k1", "k2"}  # default
    theirs = scoped(_request(frozenset({"n9"})), _job("own"), kube, scope)
    assert theirs.allowed_nodes is None and theirs.exclude == {"n9", "k1", "k2"}
    other_default = partition_scope(_config(default="own"))
    assert other_default is not None
    assert scoped(_request(), _job(None), kube, other_default).exclude == {"k1", "k2"}
    assert scoped(_request(), _job("k8s"), {}, scope).allowed_nodes == frozenset()  # none yet


def test_sinfo_lists_a_kubernetes_partitions_nodes_apart() -> None:
    parts = partitions_public(_config(), ["k1", "n1", "n2"], {"k1": "k8s"})
    assert {p["name"]: p["nodes"] for p in parts} == {"own": ["n1", "n2"], "k8s": ["k1"]}


def test_the_config_words(tmp_path: Any) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("partitions:\n  - {name: k, nodes: [a], kubernetes: {}}\n")
    with pytest.raises(ConfigError, match="backed by Kubernetes: its nodes are the Nodes"):
        load_config(path)
    path.write_text("partitions:\n  - {name: k, kubernetes: {node_selector: {'a b': c}}}\n")
    with pytest.raises(ConfigError, match="'a b' is not a Kubernetes label key"):
        load_config(path)
    section = KubernetesSection(node_selector={"pool": "lab", "mgpu.io/gpu": "a100"})
    assert section.label_selector() == "mgpu.io/gpu=a100,pool=lab"
    assert section.gpu_resource == "nvidia.com/gpu" and Decimal(section.unschedulable_timeout)


def test_a_gang_meets_at_its_rank_0_pods_address() -> None:
    rendezvous = {"MASTER_ADDR": "10.0.0.1", "PET_MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1"}
    launch = _launch(env={"MGPU_JOB_ID": "42", **rendezvous})
    section = KubernetesSection(image="b:1")

    def env_of(pod: dict[str, Any]) -> list[dict[str, Any]]:
        return list(pod["spec"]["containers"][0]["env"])

    first = env_of(build_pod(launch, section, _shape(gang=2, node_addr="10.0.0.1")))
    # Its own address from the downward API, first: the others may name it.
    assert first[0] == {
        "name": "MGPU_POD_IP",
        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
    }
    values = {e["name"]: e.get("value") for e in first}
    assert values["MASTER_ADDR"] == values["PET_MASTER_ADDR"] == "$(MGPU_POD_IP)"
    assert values["MASTER_PORT"] == "1"
    other = build_pod(
        launch, section, _shape(gang=2, rank=1, master_addr="10.232.1.5", node_addr="10.0.0.1")
    )
    values = {e["name"]: e.get("value") for e in env_of(other)}
    assert values["MASTER_ADDR"] == values["PET_MASTER_ADDR"] == "10.232.1.5"
    # A Slurm job's own MASTER_ADDR (not the Node's address mgpu set) stands.
    own = _launch(env={"MASTER_ADDR": "head.lab"})
    pod = build_pod(own, section, _shape(gang=2, rank=1, master_addr="10.232.1.5"))
    assert {e["name"]: e.get("value") for e in env_of(pod)}["MASTER_ADDR"] == "head.lab"
    # One Pod alone is unchanged: no rendezvous, no downward API.
    alone = env_of(build_pod(launch, section, _shape(node_addr="10.0.0.1")))
    assert {e["name"]: e["value"] for e in alone}["MASTER_ADDR"] == "10.0.0.1"


def test_a_held_slot_gets_a_pod_that_runs_nothing_of_the_job() -> None:

    job = Job(id="42", user="ann", argv=[], command="")
    job.allocation = [
        Slot(node_id="n1", gpu_ids=[0]),
        Slot(node_id="n2", gpu_ids=[1], cpu_ids=[4, 5], mem_mb=512),
    ]
    first = _launch(script="#!/bin/sh\nsrun hostname\n", env={"MGPU_TOKEN": "secret"})
    held = holder_launch(first, job, 1, {})
    assert held.argv == HOLD_COMMAND and held.script is None and held.time_limit is None
    assert "MGPU_TOKEN" not in held.env  # no credential in a Pod that runs nothing
    assert (held.grant.gpus, held.grant.cpus, held.grant.mem_mb) == ([1], [4, 5], 512)
    pod = build_pod(held, KubernetesSection(image="b:1"), _shape(gang=2, rank=1, holds=True))
    assert pod["metadata"]["annotations"]["mgpu.io/holds"] == "true"
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_an_allocation_is_refused_on_a_kubernetes_partition() -> None:
    """salloc / `mgpu alloc` there: one sentence (issue 33; docs/KUBERNETES.md)."""
    alloc = _job("k8s")
    alloc.kind = "allocation"
    why = kube_refused(alloc, _config())
    assert why is not None and why.startswith(
        "partition k8s runs jobs as Kubernetes Pods and holds no allocation (salloc, mgpu alloc)"
    )
    default = _job(None)
    default.kind = "allocation"
    assert kube_refused(default, _config("k8s")) == why  # the default partition's
    assert kube_refused(default, _config("own")) is None
    assert kube_refused(_job("k8s"), _config()) is None  # a job, not an allocation
    assert kube_refused(alloc, ClusterConfig()) is None


def test_a_job_on_a_terminal_is_refused_on_a_kubernetes_partition() -> None:
    """`srun --pty bash` as a job there: its Pod's command would have no terminal (a
    step on a pty in a running job's Pod has one: `srun --jobid=ID --pty`)."""
    job = _job("k8s")
    job.pty = True
    why = kube_refused(job, _config())
    assert why is not None and "have no terminal" in why and "srun --jobid=ID --pty" in why
    other = _job("own")
    other.pty = True
    assert kube_refused(other, _config()) is None
