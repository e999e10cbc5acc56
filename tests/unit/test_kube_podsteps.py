"""Steps in a Kubernetes job's Pods, the pure and in-memory parts: the Pod that starts
mgpu's pod agent (mgpu.master.kube.podsteps), a step's GPUs as its container numbers
them, the step's environment in the Pod (mgpu.podagent), and which agent the master
admits and believes (mgpu.master.kube.podagents).  The whole, against a real
Kubernetes: tests/k8s/test_kube_steps.py."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from types import SimpleNamespace
from typing import Any

import pytest

from mgpu.kubesection import KubernetesSection, PodSteps
from mgpu.master.kube.gang import holder_launch
from mgpu.master.kube.podagents import PodAgent, PodAgents
from mgpu.master.kube.podspec import PodShape, build_pod
from mgpu.master.kube.podsteps import step_for_pod
from mgpu.master.kube.runs import PodRun
from mgpu.master.state.steps import Step
from mgpu.model import Job, JobState, Slot
from mgpu.podagent.agent import step_env
from mgpu.protocol import (
    Exited,
    Grant,
    Launch,
    Output,
    Started,
    TerminalAck,
    TerminalInput,
    TerminalResize,
    TerminalSize,
)

STEPS = PodSteps(master="10.0.0.1:8443", bin="/opt/mgpu/bin")


def _launch(**kw: Any) -> Launch:
    base: dict[str, Any] = dict(
        job_id="42", epoch=3, argv=["python", "train.py"],
        env={"MGPU_JOB_ID": "42", "MGPU_TOKEN": "mgpujob_42_secret", "PATH": "/usr/bin"},
        grant=Grant(gpus=[2, 3], cpus=[0, 1], slurm=True),
    )  # fmt: skip
    return Launch(**{**base, **kw})


def _shape(**kw: Any) -> PodShape:
    base: dict[str, Any] = dict(
        cluster="lab", rank=0, slot_node="n1", pinned=False, gang=1, gpus=2, uid=1000, gid=100
    )
    return PodShape(**{**base, **kw})


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}


def test_a_pod_of_a_partition_with_steps_starts_the_pod_agent_first() -> None:
    plain = build_pod(_launch(), KubernetesSection(image="b:1"), _shape())
    pod = build_pod(_launch(), KubernetesSection(image="b:1", steps=STEPS), _shape(gang=2))
    command = pod["spec"]["containers"][0]["command"]
    assert command[:2] == ["/bin/sh", "-c"] and 'mgpu" pod-agent' in command[2]
    assert command[4:] == plain["spec"]["containers"][0]["command"] == ["python", "train.py"]
    env = _env(pod)
    assert env["MGPU_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["MGPU_MASTER"]["value"] == "10.0.0.1:8443"
    assert env["MGPU_SLURM_BIN"]["value"] == "/opt/mgpu/bin"
    names = [e["name"] for e in pod["spec"]["containers"][0]["env"]]
    assert names.count("MGPU_POD_IP") == 1  # a gang's rendezvous names it once, first
    assert names.index("MGPU_POD_IP") < names.index("MGPU_JOB_ID")
    assert "MGPU_POD_NAME" not in _env(plain)  # without `steps` nothing changes


def test_a_held_slots_pod_gets_the_jobs_credential_only_for_steps() -> None:
    job = Job(id="42", argv=["x"], command="x", user="ann")
    job.allocation = [Slot(node_id="n1", gpu_ids=[0]), Slot(node_id="n2", gpu_ids=[1])]
    nodes: dict[str, Any] = {}
    held = holder_launch(_launch(), job, 1, nodes, credential="mgpujob_42_secret")
    assert held.env["MGPU_TOKEN"] == "mgpujob_42_secret"
    assert "MGPU_TOKEN" not in holder_launch(_launch(), job, 1, nodes).env


def test_a_steps_gpus_are_named_as_its_container_numbers_them() -> None:
    grant = Grant(gpus=[3], job_gpus=[2, 3], cpus=[5], slurm=True, step=True)
    local = step_for_pod(_launch(grant=grant), slot_gpus=[2, 3])
    assert (local.grant.gpus, local.grant.job_gpus, local.grant.cpus) == ([1], [0, 1], None)


def test_a_steps_environment_in_the_pod() -> None:
    grant = Grant(gpus=[1], job_gpus=[0, 1], slurm=True, step=True)
    launch = _launch(grant=grant, env={"SLURM_PROCID": "3", "CUDA_VISIBLE_DEVICES": "7"})
    pod = {"MGPU_SLURM_BIN": "/opt/mgpu/bin", "MGPU_POD_NAME": "p-0", "PATH": "/bin"}
    pod["MGPU_BATCH_SCRIPT"] = "#!/bin/sh\necho secret\n"  # the job's, not a step's
    env = step_env(launch, pod)
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["SLURM_STEP_GPUS"] == "1"
    assert env["MGPU_GPU_IDS"] == "0,1" and env["SLURM_PROCID"] == "3"
    assert env["PATH"] == "/opt/mgpu/bin:/bin" and env["MGPU_POD_NAME"] == "p-0"
    assert "MGPU_BATCH_SCRIPT" not in env


class _Runs:
    """What PodAgents asks of a partition's PodRuns."""

    def __init__(self, steps: PodSteps | None = STEPS) -> None:
        job = Job(id="42", argv=["x"], command="x", user="ann")
        job.state, job.epoch = JobState.RUNNING, 3
        job.allocation = [Slot(node_id="n1", gpu_ids=[1])]
        self.cl = SimpleNamespace(
            jobs={"42": job},
            state=SimpleNamespace(steps=SimpleNamespace(by_id={})),
        )
        self.partition = "k8s"
        self.section = KubernetesSection(steps=steps)
        self.runs = {"pod-42": PodRun("pod-42", "42", 3, 0, "n1", time.monotonic())}
        self.told: list[tuple[str, Any]] = []

    def tell(self, node_id: str, message: Any) -> None:
        self.told.append((node_id, message))

    def _job(self, job_id: str, epoch: int) -> Job | None:
        job = self.cl.jobs.get(job_id)
        return job if job is not None and job.epoch == epoch else None

    def of_job(self, job_id: str, epoch: int) -> list[PodRun]:
        return [r for r in self.runs.values() if (r.job_id, r.epoch) == (job_id, epoch)]


def _agents(runs: _Runs) -> PodAgents:
    agents = PodAgents()
    agents.partitions.append(runs)  # type: ignore[arg-type]
    return agents


def test_only_the_jobs_own_credential_is_admitted_for_its_pod() -> None:
    runs = _Runs()
    agents = _agents(runs)
    assert isinstance(agents.admit("pod-42", "job:42"), PodAgent)
    assert "not the credential" in str(agents.admit("pod-42", "job:43"))
    assert "not the credential" in str(agents.admit("pod-42", "user:ann"))
    assert "no pod" in str(agents.admit("pod-99", "job:42"))
    runs.runs["pod-42"].ended = True
    assert "runs no job now" in str(agents.admit("pod-42", "job:42"))
    assert "runs no steps" in str(_agents(_Runs(steps=None)).admit("pod-42", "job:42"))


def test_a_step_waits_for_its_pods_agent_and_only_its_messages_count() -> None:
    async def scenario() -> None:
        runs = _Runs()
        agents = _agents(runs)
        step = SimpleNamespace(job_id="42")
        runs.cl.state.steps.by_id["42.s1.0"] = step
        launch = _launch(job_id="42.s1.0", grant=Grant(gpus=[1], slurm=True, step=True))
        agents.deliver(runs, "n1", launch)  # type: ignore[arg-type]
        assert not runs.told  # waits: no agent yet
        agent = agents.admit("pod-42", "job:42")
        assert isinstance(agent, PodAgent)
        agents.attach(agent)
        sent = Launch.model_validate_json(await agent.outbox.get())
        assert sent.job_id == "42.s1.0" and sent.grant.gpus == [0]  # as the Pod sees it
        # A message about a run that is not one of its steps is dropped.
        forged = Output(job_id="43", epoch=3, stream="o", data="x")
        agents.received(agent, forged)
        agents.received(agent, Output(job_id="42.s1.0", epoch=2, stream="o", data="x"))
        assert not runs.told
        agents.received(agent, Output(job_id="42.s1.0", epoch=3, stream="o", data="ok"))
        end = Exited(job_id="42.s1.0", epoch=3, exit_code=0, time=time.time())
        agents.received(agent, end)
        assert [m.type for _, m in runs.told] == ["output", "exited"]
        agents.received(agent, end)  # once: the step is over
        assert len(runs.told) == 2

    asyncio.run(scenario())


def test_a_step_whose_agent_never_comes_ends_with_a_sentence() -> None:
    runs = _Runs(steps=PodSteps(master="m:1", bin="/b", agent_wait=5))
    agents = _agents(runs)
    runs.cl.state.steps.by_id["42.s1.0"] = SimpleNamespace(job_id="42")
    agents.deliver(runs, "n1", _launch(job_id="42.s1.0"))  # type: ignore[arg-type]
    agents.check(time.monotonic() + 1)
    assert not runs.told
    agents.check(time.monotonic() + 6)
    [(node, end)] = runs.told
    assert node == "n1" and end.exit_code is None
    assert "pod agent of pod pod-42 did not connect within 5 s" in end.launch_error


@pytest.mark.parametrize("grant", [Grant(gpus=[], slurm=True)])
def test_a_step_on_a_node_without_the_jobs_pod_is_refused(grant: Grant) -> None:
    runs = _Runs()
    agents = _agents(runs)
    runs.cl.state.steps.by_id["42.s1.0"] = SimpleNamespace(job_id="42")
    agents.deliver(runs, "n2", _launch(job_id="42.s1.0", grant=grant))  # type: ignore[arg-type]
    [(_, end)] = runs.told
    assert "no pod on n2" in end.launch_error


def _stored_step(step_id: str, node: str = "n1", epoch: int = 3, done: bool = False) -> Step:
    return Step(id=step_id, job_id="42", epoch=epoch, node_id=node, done=done)


def test_a_restarted_master_follows_the_steps_its_pods_agents_run() -> None:
    """After a master's start, the stored steps running in the job's Pod are followed
    again: reported in the Node's hello (not lost), their end from the Pod's agent told
    (it was dropped before: the step stayed running, its srun waiting)."""

    async def scenario() -> None:
        runs = _Runs()
        agents = _agents(runs)
        by_id = runs.cl.state.steps.by_id
        by_id["42.s1.0"] = _stored_step("42.s1.0")
        by_id["42.s2.0"] = _stored_step("42.s2.0", done=True)  # ended: not followed
        by_id["42.s3.0"] = _stored_step("42.s3.0", node="n2")  # another Pod's
        by_id["42.s4.0"] = _stored_step("42.s4.0", epoch=2)  # an earlier run's
        agents.adopt(runs, runs.runs["pod-42"])  # type: ignore[arg-type]
        assert agents.on_node("n1") == [("42.s1.0", 3)]
        agent = agents.admit("pod-42", "job:42")
        assert isinstance(agent, PodAgent)
        agents.attach(agent)
        assert agent.outbox.empty()  # an adopted step is not sent again: it runs there
        started = Started(job_id="42.s1.0", epoch=3, pid=7, hostname="p", ip="1.2.3.4", time=1.0)
        agents.received(agent, started)  # the agent says it has it
        agents.check(time.monotonic() + 3600)  # confirmed: no wait runs out
        agents.received(agent, Exited(job_id="42.s1.0", epoch=3, exit_code=4, time=2.0))
        assert [(n, m.type) for n, m in runs.told] == [("n1", "started"), ("n1", "exited")]
        assert runs.told[-1][1].exit_code == 4
        assert agents.on_node("n1") == []

    asyncio.run(scenario())


def test_an_adopted_step_its_pods_agent_does_not_have_ends_with_a_sentence() -> None:
    runs = _Runs(steps=PodSteps(master="m:1", bin="/b", agent_wait=5))
    agents = _agents(runs)
    runs.cl.state.steps.by_id["42.s1.0"] = _stored_step("42.s1.0")
    agents.adopt(runs, runs.runs["pod-42"])  # type: ignore[arg-type]
    agent = agents.admit("pod-42", "job:42")
    assert isinstance(agent, PodAgent)
    agents.attach(agent)  # it connects, and never says it runs the step
    agents.check(time.monotonic() + 1)
    assert not runs.told
    agents.check(time.monotonic() + 6)
    [(node, end)] = runs.told
    assert node == "n1" and end.exit_code is None
    assert "pod agent of pod pod-42 does not run it" in end.launch_error


def test_a_terminal_steps_input_goes_to_its_pods_agent_or_is_acknowledged() -> None:
    """`srun --pty` in a Pod: typed input and size changes go to the Pod's agent, its
    acknowledgements back; input while the agent is away is acknowledged as dropped (the
    client's window must not wait for it)."""

    async def scenario() -> None:
        runs = _Runs()
        agents = _agents(runs)
        runs.cl.state.steps.by_id["42.s1.0"] = SimpleNamespace(job_id="42")
        size = TerminalSize(rows=30, cols=100)
        launch = _launch(job_id="42.s1.0", pty=size)
        agents.deliver(runs, "n1", launch)  # type: ignore[arg-type]
        typed = TerminalInput(job_id="42.s1.0", epoch=3, data=base64.b64encode(b"ls\n").decode())
        agents.deliver(runs, "n1", typed)  # type: ignore[arg-type]
        [(node, ack)] = runs.told  # no agent yet: dropped
        assert node == "n1" and isinstance(ack, TerminalAck) and ack.bytes == 3
        agent = agents.admit("pod-42", "job:42")
        assert isinstance(agent, PodAgent)
        agents.attach(agent)
        assert Launch.model_validate_json(await agent.outbox.get()).pty == size
        agents.deliver(runs, "n1", typed)  # type: ignore[arg-type]
        resize = TerminalResize(job_id="42.s1.0", epoch=3, size=size)
        agents.deliver(runs, "n1", resize)  # type: ignore[arg-type]
        sent = [json.loads(await agent.outbox.get())["type"] for _ in range(2)]
        assert sent == ["terminal_input", "terminal_resize"]
        agents.received(agent, TerminalAck(job_id="42.s1.0", epoch=3, bytes=3))
        assert [m.type for _, m in runs.told] == ["terminal_ack", "terminal_ack"]

    asyncio.run(scenario())
