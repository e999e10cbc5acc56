"""A job's credential and batch script are kept in a Secret, not in its Pod's spec
(mgpu.master.kube.podspec.keep_private): anyone who may read the namespace's Pods could
otherwise act as the job's user.  The Secret is made before the Pod, owned by it once made
(Kubernetes deletes it with the Pod), removed when the Pod is not made, and swept at a
master's start when a master stopped in between."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from mgpu.kube import KubeError
from mgpu.kubesection import KubernetesSection
from mgpu.master.kube.pods import PodRuns
from mgpu.master.kube.podspec import PodShape, build_pod, keep_private
from mgpu.protocol import Grant, Launch

SCRIPT = "#!/bin/sh\necho secret-work\n"
TOKEN = "mgpu_job_credential_of_job_42"


def _launch(**kw: Any) -> Launch:
    base: dict[str, Any] = dict(
        job_id="42", epoch=3, argv=[], script=SCRIPT, script_name="run.sh",
        env={"MGPU_JOB_ID": "42", "MGPU_TOKEN": TOKEN, "SLURM_JOB_ID": "42"},
        grant=Grant(gpus=[0], cpus=[0], mem_mb=1024, slurm=True), cwd="/tmp", kill_grace=5.0,
    )  # fmt: skip
    return Launch(**{**base, **kw})


def _shape() -> PodShape:
    return PodShape(
        cluster="lab", rank=0, slot_node="n1", pinned=False, gang=1, gpus=1, uid=1000, gid=100
    )


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}


def test_the_pods_spec_holds_no_credential_nor_script() -> None:
    pod = build_pod(_launch(), KubernetesSection(image="b:1"), _shape())
    secret = keep_private(pod)
    assert secret is not None
    assert TOKEN not in str(pod) and "secret-work" not in str(pod)
    env = _env(pod)
    for key in ("MGPU_TOKEN", "MGPU_BATCH_SCRIPT"):
        ref = {"secretKeyRef": {"name": "mgpu-lab-42-3-0", "key": key}}
        assert env[key] == {"name": key, "valueFrom": ref}
    assert env["SLURM_JOB_ID"] == {"name": "SLURM_JOB_ID", "value": "42"}  # the rest as it was
    assert secret["metadata"]["name"] == pod["metadata"]["name"]
    assert secret["stringData"] == {"MGPU_TOKEN": TOKEN, "MGPU_BATCH_SCRIPT": SCRIPT}
    assert secret["metadata"]["labels"]["mgpu.io/cluster"] == "lab"
    assert secret["metadata"]["annotations"] == {"mgpu.io/job-id": "42"}


def test_a_pod_with_nothing_private_has_no_secret() -> None:
    launch = _launch(script=None, argv=["true"], env={"MGPU_JOB_ID": "42"})
    pod = build_pod(launch, KubernetesSection(image="b:1"), _shape())
    assert keep_private(pod) is None
    assert "valueFrom" not in str(_env(pod))


class FakeKube:
    """What PodRuns asks of Kubernetes, recorded; `fail_pod`: the Pod's creation refused."""

    def __init__(self, fail_pod: KubeError | None = None, secrets: list[Any] | None = None):
        self.calls: list[tuple[str, Any]] = []
        self.fail_pod = fail_pod
        self.secrets = secrets or []

    async def create_secret(self, secret: dict[str, Any], namespace: str | None = None) -> Any:
        self.calls.append(("create_secret", secret["metadata"]["name"]))
        return secret

    async def create_pod(self, pod: dict[str, Any], namespace: str | None = None) -> Any:
        self.calls.append(("create_pod", pod["metadata"]["name"]))
        if self.fail_pod is not None:
            raise self.fail_pod
        return {"metadata": {"uid": "uid-1"}}

    async def own_secret(self, name: str, owner: dict[str, Any], namespace: Any = None) -> None:
        self.calls.append(("own_secret", (name, owner["kind"], owner["uid"])))

    async def delete_secret(self, name: str, namespace: str | None = None) -> bool:
        self.calls.append(("delete_secret", name))
        return True

    async def list_secrets(self, namespace: Any = None, *, label_selector: Any = None) -> Any:
        self.calls.append(("list_secrets", label_selector))
        return SimpleNamespace(items=self.secrets)


def _runs(kube: FakeKube, told: list[Any]) -> PodRuns:
    cluster = SimpleNamespace(
        config=SimpleNamespace(cluster=SimpleNamespace(name="lab")),
        jobs={},
        nodes={},
        store=SimpleNamespace(fence=SimpleNamespace(generation=None)),
        agent_message=lambda node, message: told.append((node, message)),
    )
    section = KubernetesSection(image="b:1")
    return PodRuns(cluster, "k8s", section, kube)  # type: ignore[arg-type]


def _create(runs: PodRuns) -> None:
    job = SimpleNamespace(
        id="42", epoch=3, allocation=[SimpleNamespace(node_id="n1")], nodelist=None
    )

    async def scenario() -> None:
        await runs._create(job, "n1", _launch(), 0, (1000, 100), False)  # type: ignore[arg-type]
        for _ in range(50):  # the spawned follow-ups
            await asyncio.sleep(0)

    asyncio.run(scenario())


def test_the_secret_is_made_first_and_then_owned_by_its_pod() -> None:
    kube = FakeKube()
    _create(_runs(kube, []))
    assert kube.calls == [
        ("create_secret", "mgpu-lab-42-3-0"),
        ("create_pod", "mgpu-lab-42-3-0"),
        ("own_secret", ("mgpu-lab-42-3-0", "Pod", "uid-1")),
    ]


def test_a_pod_refused_leaves_no_secret() -> None:
    told: list[Any] = []
    kube = FakeKube(fail_pod=KubeError("Kubernetes refused to create a pod: bad"))
    _create(_runs(kube, told))
    assert kube.calls[-1] == ("delete_secret", "mgpu-lab-42-3-0")
    [(node, exited)] = told
    assert node == "n1" and "refused to create a pod" in exited.launch_error


def test_a_masters_start_gives_or_sweeps_unowned_secrets() -> None:
    def secret(name: str, age_s: float, owned: bool = False) -> dict[str, Any]:
        import datetime as dt

        made = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=age_s)
        meta: dict[str, Any] = {
            "name": name,
            "creationTimestamp": made.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        if owned:
            meta["ownerReferences"] = [{"kind": "Pod"}]
        return {"metadata": meta}

    kube = FakeKube(
        secrets=[
            secret("with-pod", 600),  # its Pod is there: given to it
            secret("stale", 600),  # no Pod, old: a master stopped before making it
            secret("young", 5),  # no Pod yet: a launch in flight
            secret("owned", 600, owned=True),  # Kubernetes' to delete
        ]
    )
    asyncio.run(_runs(kube, []).secrets.sweep({"with-pod": "uid-9"}, "lab"))
    assert kube.calls == [
        ("list_secrets", "mgpu.io/cluster=lab"),
        ("own_secret", ("with-pod", "Pod", "uid-9")),
        ("delete_secret", "stale"),
    ]
