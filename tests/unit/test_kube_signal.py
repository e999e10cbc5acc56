"""`scancel --signal` (and `-b`, and a cancel's `--signal` warning) for a job on a
Kubernetes partition: delivered through the job's Pods' agents with `kubernetes.steps`
(mgpu.master.kube.podagents, mgpu.podagent.jobsignal), refused with a sentence without
it.  Against a real Kubernetes: tests/k8s/test_kube_signal.py."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from mgpu.kubesection import KubernetesSection, PodSteps
from mgpu.master.control.jobctl import Actor, JobControl, SignalAsked
from mgpu.master.control.nodes import Conflict
from mgpu.master.kube.link import KubeLink
from mgpu.master.kube.podagents import PodAgent
from mgpu.master.kube.pods import PodRuns
from mgpu.master.kube.runs import PodRun
from mgpu.model import Job, JobState, Slot, SlotPhase
from mgpu.podagent.jobsignal import Proc, targets
from mgpu.protocol import Kill, SignalRun

STEPS = PodSteps(master="10.0.0.1:8443", bin="/opt/mgpu/bin", agent_wait=5)


def _job() -> Job:
    job = Job(id="42", argv=["x"], command="x", user="ann")
    job.state, job.epoch = JobState.RUNNING, 3
    job.allocation = [Slot(node_id="n1", gpu_ids=[1], phase=SlotPhase.STARTED)]
    return job


class _Client:
    def __init__(self) -> None:
        self.deleted: list[tuple[str, int | None]] = []

    async def delete_pod(self, name: str, namespace: str, **kw: Any) -> None:
        self.deleted.append((name, kw.get("grace_seconds")))


def _runs(steps: PodSteps | None = STEPS) -> tuple[PodRuns, _Client]:
    cl: Any = SimpleNamespace(jobs={"42": _job()})
    client = _Client()
    runs = PodRuns(cl, "k8s", KubernetesSection(steps=steps), client)  # type: ignore[arg-type]
    runs.runs["pod-42"] = PodRun("pod-42", "42", 3, 0, "n1", time.monotonic())
    return runs, client


def _connected(runs: PodRuns) -> PodAgent:
    agent = PodAgent("pod-42", runs, runs.runs["pod-42"])
    runs.agents.attach(agent)
    return agent


def test_a_signal_to_the_job_goes_to_its_pods_agent_once_it_is_there() -> None:
    async def scenario() -> None:
        runs, _ = _runs()
        runs.deliver("n1", SignalRun(job_id="42", epoch=3, signal=10, top_only=True))
        await asyncio.sleep(0)  # delivered on the loop, after the unit of work
        agent = _connected(runs)  # it waited for the agent
        sent = SignalRun.model_validate_json(await agent.outbox.get())
        assert (sent.job_id, sent.signal, sent.top_only) == ("42", 10, True)
        runs.deliver("n2", SignalRun(job_id="42", epoch=3, signal=12))  # no pod of it there
        runs.deliver("n1", SignalRun(job_id="42", epoch=2, signal=12))  # an older run
        await asyncio.sleep(0)
        assert agent.outbox.empty()

    asyncio.run(scenario())


def test_a_signal_whose_agent_never_comes_is_dropped_after_agent_wait() -> None:
    async def scenario() -> None:
        runs, _ = _runs()
        runs.agents.signal_job(runs, "n1", SignalRun(job_id="42", epoch=3, signal=10))
        runs.agents.check(time.monotonic() + 1)
        assert runs.agents.signals
        runs.agents.check(time.monotonic() + 6)
        assert not runs.agents.signals
        agent = _connected(runs)
        assert agent.outbox.empty()

    asyncio.run(scenario())


def test_a_kill_with_a_signal_sends_it_first_then_deletes_the_pod_with_its_grace() -> None:
    async def scenario() -> None:
        runs, client = _runs()
        agent = _connected(runs)
        kill = Kill(job_id="42", epoch=3, grace=20, signal=10, signal_lead=600)
        runs.deliver("n1", kill)
        sent = SignalRun.model_validate_json(await asyncio.wait_for(agent.outbox.get(), 45))
        assert (sent.signal, sent.top_only) == (10, False)
        for _ in range(5):
            await asyncio.sleep(0)
        assert not client.deleted  # the job has its lead to end on its own
        runs.runs["pod-42"].ended = True  # it did (its trap exited)
        deadline = time.monotonic() + 45
        while not client.deleted and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert client.deleted == [("pod-42", 20)]

    asyncio.run(scenario())


def test_a_kill_without_steps_deletes_the_pod_at_once() -> None:
    async def scenario() -> None:
        runs, client = _runs(steps=None)
        runs.deliver("n1", Kill(job_id="42", epoch=3, grace=20, signal=10, signal_lead=600))
        deadline = time.monotonic() + 45
        while not client.deleted and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert client.deleted == [("pod-42", 20)]

    asyncio.run(scenario())


def test_a_jobs_signal_without_pod_agents_is_refused_with_a_sentence() -> None:
    job = _job()
    link = KubeLink("n1", lambda node_id, message: None, no_signal="no pod agents here")
    state: Any = SimpleNamespace(nodes={"n1": SimpleNamespace(link=link)})
    control = JobControl.__new__(JobControl)
    control.state = state
    actor = Actor(user="ann", admin=False)
    try:
        control.signal(job, actor, SignalAsked(10))
    except Conflict as e:
        assert str(e) == "job 42 cannot be signalled: no pod agents here"
    else:
        raise AssertionError("the signal was not refused")


def _p(pid: int, ppid: int, sid: int, marked: bool = False) -> Proc:
    return Proc(pid, ppid, sid, marked)


def test_the_pod_agent_signals_the_jobs_processes_never_itself_or_its_steps() -> None:
    # pid 1: the batch script; 7 its child; 20 the agent (own session); 30 a step, 31 its child.
    procs = [_p(7, 1, 1), _p(1, 0, 1), _p(20, 1, 20), _p(30, 20, 30), _p(31, 30, 30)]
    assert targets(procs, me=20, steps={30}, top_only=False) == [1, 7]
    assert targets(procs, me=20, steps={30}, top_only=True) == [1]


def test_under_the_output_runner_only_the_marked_script_and_its_children() -> None:
    # pid 1 the -o/-e runner, 5 its subshell, 6 tee, 8 the script (marked), 9 its child.
    procs = [_p(1, 0, 1), _p(5, 1, 1), _p(6, 5, 1), _p(8, 5, 1, True), _p(9, 8, 1, True)]
    procs.append(_p(20, 1, 20))
    assert targets(procs, me=20, steps=set(), top_only=False) == [8, 9]
    assert targets(procs, me=20, steps=set(), top_only=True) == [8]


def test_the_time_limits_signal_warning_goes_to_the_pods_agent_once() -> None:
    """`--signal=B:USR1@60` with a 600 s limit: the Pod's agent sends USR1 to the batch
    script 60 s before the limit (as slurmstepd), once, and the Pod is not deleted then."""

    async def scenario() -> None:
        runs, client = _runs()
        agent = _connected(runs)
        run = runs.runs["pod-42"]
        run.time_limit, run.started_at = 600.0, 1000.0
        runs.arm_warning(run, 10, 60.0, True)
        runs.check(1000.0 + 530)  # 70 s left: not yet
        assert agent.outbox.empty()
        runs.check(1000.0 + 545)  # 55 s left
        sent = SignalRun.model_validate_json(await asyncio.wait_for(agent.outbox.get(), 45))
        assert (sent.job_id, sent.epoch, sent.signal, sent.top_only) == ("42", 3, 10, True)
        runs.check(1000.0 + 550)
        assert agent.outbox.empty() and not run.killing and not client.deleted

    asyncio.run(scenario())


def test_no_time_limit_warning_is_armed_without_pod_agents() -> None:
    runs, _ = _runs(steps=None)
    run = runs.runs["pod-42"]
    runs.arm_warning(run, 10, 60.0, False)
    assert run.warning is None


def test_in_a_shared_namespace_the_pods_pause_is_never_signalled() -> None:
    """shareProcessNamespace: pid 1 is the Pod's pause (it would end the Pod); the job's
    top is the process the runtime started (parent 0), here the batch script, pid 7."""
    # 1 pause; 7 the script, 9 its child; 12 the agent (its subshell gone: parent 1).
    procs = [_p(1, 0, 1), _p(7, 0, 7), _p(9, 7, 7), _p(12, 1, 12), _p(30, 12, 30)]
    assert targets(procs, me=12, steps={30}, top_only=False) == [7, 9]
    assert targets(procs, me=12, steps={30}, top_only=True) == [7]
    # Under the -o/-e runner (7), its marked script (8) as before.
    runner = [_p(1, 0, 1), _p(7, 0, 7), _p(8, 7, 7, True), _p(12, 1, 12)]
    assert targets(runner, me=12, steps=set(), top_only=True) == [8]


def test_under_pod_init_its_child_is_the_top_and_it_is_never_signalled() -> None:
    """`mgpu pod-init` (7, the runtime's process, marked) sends on what it is sent: the
    agent signals its child (8, the batch script) and the script's own child (9), never
    pod-init itself, which would send the signal to the script a second time."""
    init = Proc(7, 0, 7, False, init=True)
    procs = [_p(1, 0, 1), init, _p(8, 7, 7), _p(9, 8, 7), _p(12, 1, 12), _p(30, 12, 30)]
    assert targets(procs, me=12, steps={30}, top_only=False) == [8, 9]
    assert targets(procs, me=12, steps={30}, top_only=True) == [8]
    # Under the -o/-e runner (8) too: its marked script (10).
    runner = [_p(1, 0, 1), init, _p(8, 7, 7), _p(10, 8, 7, True), _p(12, 1, 12)]
    assert targets(runner, me=12, steps=set(), top_only=True) == [10]
