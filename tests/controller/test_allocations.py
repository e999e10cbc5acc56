"""Allocations (`mgpu alloc`) and terminals (`srun --pty`) in the controller: an allocation
holds its GPUs and runs nothing, its steps run on them, it ends with its client's command
(completed or failed with its code), at its time limit, when cancelled, when its client
goes silent, and fails with a lost node; a terminal's size and keys reach its node."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from harness import FakeAgent, Harness, seen_env
from pydantic import ValidationError

from mgpu.master.control.allocations import StepRequest
from mgpu.master.control.submit import SubmitError
from mgpu.master.http.sentences import validation_sentence
from mgpu.master.state.registry import INPUT_WINDOW
from mgpu.model import JobState, SlotPhase
from mgpu.protocol import (
    MAX_TERMINAL_INPUT,
    TERMINAL_ACK_EVERY,
    Launch,
    TerminalAck,
    TerminalInput,
    TerminalResize,
)


def _alloc(h: Harness, **fields: Any) -> str:
    job_id = h.submit("bash", allocation=True, **fields)
    h.tick()
    return job_id


def _step(h: Harness, job_id: str, argv: list[str] | None = None, **fields: Any) -> str:
    request = StepRequest(argv=argv or ["nvidia-smi"], env=fields.pop("env", {}), **fields)
    step = h.cl.allocations.start_step(job_id, request)
    h.settle()
    return step.id


def test_an_allocation_holds_its_gpus_and_runs_nothing(h: Harness) -> None:
    n1 = h.agent("n1")
    job_id = _alloc(h, gpus=2)
    job = h.job(job_id)
    assert job.state == JobState.RUNNING and job.reason is None
    assert job.start_time == h.clock.now and job.attempts[-1].start_time == h.clock.now
    (slot,) = job.allocation
    assert (slot.phase, slot.hostname) == (SlotPhase.HELD, "host-n1")
    assert sorted(h.node("n1").busy) == slot.gpu_ids and len(slot.gpu_ids) == 2
    assert n1.link.take() == []  # no launch, no port: nothing runs on the node
    assert h.stored(job_id).state == JobState.RUNNING  # written, as any start
    assert h.job(job_id).to_public()["kind"] == "allocation"


def test_a_step_runs_on_the_allocation_with_the_environment_of_its_srun(h: Harness) -> None:
    n1 = h.agent("n1")
    job_id = _alloc(h, gpus=2)
    env = {"FOO": "bar", "CUDA_VISIBLE_DEVICES": "7", "MGPU_JOB_ID": "nope"}
    step_id = _step(h, job_id, ["python", "a b.py"], env=env, cwd="/data")
    (launch,) = n1.launches()
    gpus = h.job(job_id).allocation[0].gpu_ids
    assert (launch.job_id, launch.epoch) == (step_id, h.job(job_id).epoch)
    assert launch.argv == ["python", "a b.py"]  # executed directly, as srun does
    assert launch.grant.gpus == gpus and launch.cwd == "/data" and launch.pty is None
    assert launch.env["FOO"] == "bar" and "CUDA_VISIBLE_DEVICES" not in launch.env
    seen = seen_env(launch)
    assert seen["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, gpus))  # the allocation's
    assert "SLURM_STEP_GPUS" not in seen  # a step of an allocation, not an srun task
    assert launch.env["MGPU_JOB_ID"] == job_id


def test_steps_run_at_once_and_on_every_node_unless_told(h: Harness) -> None:
    n1, n2 = h.agent("n1"), h.agent("n2")
    job_id = _alloc(h, nodes=2, gpus_per_node=1)
    first, second = _step(h, job_id), _step(h, job_id)
    assert first != second
    assert [m.job_id for m in n1.launches()] == [first, second]
    assert [m.job_id for m in n2.launches()] == [first, second]
    only = _step(h, job_id, nodes=["n2"])
    assert n1.launches() == [] and [m.job_id for m in n2.launches()] == [only]
    terminal = _step(h, job_id, ["bash"], pty=True, pty_size=[40, 120])
    (launch,) = n1.launches()  # a terminal is task zero's only
    assert launch.job_id == terminal and (launch.pty.rows, launch.pty.cols) == (40, 120)
    assert n2.launches() == []


def test_a_step_on_several_nodes_ends_with_the_last_and_the_first_bad_code(h: Harness) -> None:
    n1, n2 = h.agent("n1"), h.agent("n2")
    job_id = _alloc(h, nodes=2, gpus_per_node=1)
    step_id = _step(h, job_id)
    step = h.cl.steps.by_id[step_id]
    n1.exited(step_id, 0, epoch=step.epoch)
    assert not step.done
    n1.exited(step_id, 0, epoch=step.epoch)  # re-sent after a reconnect: counted once
    n2.exited(step_id, 3, epoch=step.epoch)
    assert step.done and step.exit_code == 3
    assert h.job(job_id).state == JobState.RUNNING  # a step's end is not the allocation's


STEP_REFUSALS = [
    ("a plain job", {}, "is not an allocation"),
    ("not started", {"allocation": True, "gpus": 4}, "has not started yet"),
]


@pytest.mark.parametrize(("fields", "sentence"), [c[1:] for c in STEP_REFUSALS])
def test_a_step_needs_a_running_allocation(
    h: Harness, fields: dict[str, Any], sentence: str
) -> None:
    h.agent("n1")
    h.start("sleep 100", gpus=1)  # the allocation of 4 GPUs waits behind it
    job_id = h.submit("bash", **fields)
    h.tick()
    with pytest.raises(SubmitError, match=sentence):
        _step(h, job_id)


def test_a_step_only_on_the_allocations_nodes(h: Harness) -> None:
    h.agent("n1"), h.agent("n2")
    job_id = _alloc(h, gpus=1, nodelist=["n1"])
    with pytest.raises(SubmitError, match=r"n2 is not one of allocation \w+'s nodes \(n1\)"):
        _step(h, job_id, nodes=["n2"])


# ---- how an allocation ends -------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "state", "reason"),
    [(0, JobState.COMPLETED, None), (3, JobState.FAILED, "exit code 3")],
)
def test_it_ends_with_its_clients_command(
    h: Harness, code: int, state: JobState, reason: str | None
) -> None:
    n1 = h.agent("n1")
    job_id = _alloc(h, gpus=2)
    step_id = _step(h, job_id, ["sleep", "100"])
    n1.link.take()
    assert h.cl.allocations.end(h.job(job_id), code)
    h.settle()
    job = h.stored(job_id)
    assert (job.state, job.exit_code, job.reason) == (state, code, reason)
    assert h.node("n1").busy == {}
    (kill,) = n1.kills()
    assert kill.job_id == step_id  # its steps end with it
    assert not h.cl.allocations.end(h.job(job_id), 0)  # already ended


def test_it_ends_at_its_time_limit_with_its_steps(h: Harness) -> None:
    n1 = h.agent("n1")
    job_id = _alloc(h, gpus=1, time="0:10")
    step_id = _step(h, job_id, ["sleep", "100"])
    n1.link.take()
    h.advance(9)
    n1.heartbeat()
    h.tick()
    assert h.job(job_id).state == JobState.RUNNING
    h.advance(2)
    h.tick()
    job = h.stored(job_id)
    assert (job.state, job.reason) == (JobState.TIMEOUT, "time limit reached")
    assert [k.job_id for k in n1.kills()] == [step_id]
    assert h.cl.steps.by_id.get(step_id) is None


def test_a_cancelled_allocation_ends_at_once(h: Harness) -> None:
    n1 = h.agent("n1")
    job_id = _alloc(h, gpus=1)
    assert h.cl.cancel(h.job(job_id), actor="alice")
    h.settle()
    assert h.stored(job_id).state == JobState.CANCELLED  # no process to wait for
    assert h.node("n1").busy == {} and n1.kills() == []


def test_a_lost_node_fails_it_never_requeues_it(h: Harness) -> None:
    h.agent("n1")
    job_id = _alloc(h, gpus=1)
    h.advance(h.config.networking.timeout + 1)
    h.cl.sessions.touch(job_id)  # its client is there: the node is what went
    h.tick()
    job = h.stored(job_id)
    assert job.state == JobState.FAILED and "node n1 lost" in (job.reason or "")


def test_it_survives_a_master_restart(h: Harness) -> None:
    n1 = h.agent("n1")
    job_id = _alloc(h, gpus=2)
    gpus = h.job(job_id).allocation[0].gpu_ids
    h.crash()
    n1.hello()
    h.tick()
    job = h.job(job_id)
    assert job.state == JobState.RUNNING and job.allocation[0].phase == SlotPhase.HELD
    assert sorted(h.node("n1").busy) == gpus  # held, not lost, not given to another job
    assert n1.kills() == []


# ---- clients that go away ---------------------------------------------------------


def _keep_node(h: Harness, agent: FakeAgent, seconds: float, touch: str | None = None) -> None:
    """Let `seconds` pass in steps, the node's agent (and the client, if named) alive."""
    for _ in range(int(seconds)):
        h.advance(1)
        agent.heartbeat()
        if touch is not None:
            h.cl.sessions.touch(touch)
        h.tick()


def test_an_allocation_whose_client_is_silent_is_cancelled(h: Harness) -> None:
    n1 = h.agent("n1")
    job_id = _alloc(h, gpus=1)
    timeout = h.config.networking.timeout
    _keep_node(h, n1, timeout + 5, touch=job_id)  # heard from: kept
    assert h.job(job_id).state == JobState.RUNNING
    _keep_node(h, n1, timeout + 2)
    job = h.stored(job_id)
    assert job.state == JobState.CANCELLED and "its client went away" in (job.reason or "")
    assert h.node("n1").busy == {}
    assert [e["target"] for e in h.events("cancel")] == [job_id]


def test_a_jump_of_the_wall_clock_ends_no_allocation(h: Harness) -> None:
    """A client's silence is measured on the monotonic clock: the master's wall clock
    stepping 120 s ahead does not make a client that just spoke look gone."""
    n1 = h.agent("n1")
    job_id = _alloc(h, gpus=1)
    _keep_node(h, n1, 2, touch=job_id)
    h.clock.jump(120.0)
    h.advance(0.5)  # the next look, before the client's next word
    n1.heartbeat()
    h.tick()
    assert h.job(job_id).state == JobState.RUNNING
    assert h.events("cancel") == []


def test_terminals_whose_client_is_gone_end_queued_running_and_steps(h: Harness) -> None:
    n1 = h.agent("n1", gpus=1)
    running = h.start("bash", pty=True)
    queued = h.submit("bash", pty=True)  # waits for the one GPU
    _keep_node(h, n1, h.config.networking.timeout + 2)
    assert h.stored(queued).state == JobState.CANCELLED
    assert h.job(running).desired.value == "stop"
    assert [k.job_id for k in n1.kills()] == [running]
    n1.exited(running, 129)
    assert h.stored(running).state == JobState.CANCELLED


def test_a_terminal_step_whose_client_is_gone_is_killed(h: Harness) -> None:
    n1 = h.agent("n1")
    job_id = _alloc(h, gpus=1)
    step_id = _step(h, job_id, ["bash"], pty=True)
    n1.link.take()
    _keep_node(h, n1, h.config.networking.timeout + 2, touch=job_id)
    assert [k.job_id for k in n1.kills()] == [step_id]
    assert h.job(job_id).state == JobState.RUNNING  # the allocation's own client is there


# ---- terminals --------------------------------------------------------------------


def test_a_terminal_gets_the_clients_size_and_keys(h: Harness) -> None:
    n1 = h.agent("n1", gpus=1)
    h.start("sleep 100", gpus=1)
    job_id = h.submit("bash", pty=True, pty_size=[30, 90])
    h.cl.sessions.resize(job_id, 33, 101)  # changed while it waits: launched with it
    assert not h.cl.sessions.terminal_input(job_id, b"x")  # nothing runs yet: dropped
    n1.link.take()
    first = next(j for j in h.cl.jobs if j != job_id)
    n1.exited(first, 0)
    h.tick()
    (launch,) = n1.launches()
    assert launch.pty is not None and (launch.pty.rows, launch.pty.cols) == (33, 101)
    assert h.job(job_id).interactive  # the idle rules of interactive jobs apply
    n1.started(job_id)
    assert h.cl.sessions.terminal_input(job_id, b"\x03ls\r")
    h.cl.sessions.resize(job_id, 50, 120)
    h.settle()
    typed, resized = n1.link.take(TerminalInput), n1.link.take(TerminalResize)
    assert [base64.b64decode(m.data) for m in typed] == [b"\x03ls\r"]
    assert typed[0].epoch == h.job(job_id).epoch
    assert [(m.size.rows, m.size.cols) for m in resized] == [(50, 120)]


def test_a_plain_job_has_no_terminal(h: Harness) -> None:
    n1 = h.agent("n1")
    job_id = h.start("sleep 100")
    (launch,) = n1.link.take(Launch)
    assert launch.pty is None
    assert not h.cl.sessions.terminal_input(job_id, b"x")
    h.cl.sessions.resize(job_id, 10, 10)
    h.settle()
    assert n1.link.take() == []


# ---- refused at submit ------------------------------------------------------------

REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"pty": True, "array": "0-3"}, "--pty runs one program at a terminal, not a job array"),
    ({"pty": True, "nodes": 2}, "--pty runs one program on one node"),
    ({"pty": True, "distributed": True}, "--pty runs one program on one node"),
    ({"pty": True, "image": "ubuntu"}, "--pty does not work with --image"),
    ({"pty": True, "allocation": True}, "use mgpu srun --pty inside it"),
    ({"pty": True, "pty_size": [0, 80]}, "--pty size must be [rows, columns]"),
    ({"allocation": True, "array": "0-3"}, "--array does not apply to an allocation"),
    ({"allocation": True, "mpi": True}, "--mpi does not apply to an allocation"),
    ({"allocation": True, "preemptible": True}, "--preemptible does not apply"),
    ({"allocation": True, "retries": 2}, "--retries does not apply to an allocation"),
]


@pytest.mark.parametrize(("fields", "sentence"), REFUSED)
def test_impossible_terminals_and_allocations_are_refused(
    h: Harness, fields: dict[str, Any], sentence: str
) -> None:
    h.agent("n1")
    with pytest.raises(ValidationError) as e:
        h.submit("bash", **fields)
    assert sentence in validation_sentence(e.value)
    assert h.cl.jobs == {} and h.store.load_active_jobs() == []


def test_ended_terminal_steps_are_forgotten(h: Harness) -> None:
    n1 = h.agent("n1")
    job_id = _alloc(h, gpus=1)
    step_id = _step(h, job_id, ["bash"], pty=True)
    h.cl.sessions.touch(step_id)
    step = h.cl.steps.by_id[step_id]
    n1.exited(step_id, 0, epoch=step.epoch)
    h.tick()
    assert set(h.cl.sessions.last_seen) == {job_id}  # no trace of the step is kept


def test_a_terminals_input_is_held_to_its_window_until_the_agent_acknowledges(
    h: Harness,
) -> None:
    n1 = h.agent("n1", gpus=1)
    job_id = h.start("bash", pty=True)
    assert h.cl.sessions.input_room(job_id) is None  # nothing in flight: room
    frame = b"y" * MAX_TERMINAL_INPUT
    sent = 0
    while h.cl.sessions.input_room(job_id) is None:
        assert h.cl.sessions.terminal_input(job_id, frame)
        sent += len(frame)
        assert sent <= INPUT_WINDOW + MAX_TERMINAL_INPUT, "the window never filled"
    room = h.cl.sessions.input_room(job_id)
    assert room is not None and not room.is_set()
    h.settle()
    assert sum(len(base64.b64decode(m.data)) for m in n1.link.take(TerminalInput)) == sent
    epoch = h.job(job_id).epoch
    n1.send(TerminalAck(job_id=job_id, epoch=epoch, bytes=TERMINAL_ACK_EVERY))
    assert room.is_set()  # the agent passed some on: the client may send again
    assert h.cl.sessions.input_room(job_id) is None
    n1.send(TerminalAck(job_id=job_id, epoch=epoch, bytes=sent))  # all of it, and more
    assert not n1.link.input  # nothing in flight: nothing kept


def test_a_terminals_window_goes_with_its_agents_connection(h: Harness) -> None:
    n1 = h.agent("n1", gpus=1)
    job_id = h.start("bash", pty=True)
    while h.cl.sessions.input_room(job_id) is None:
        h.cl.sessions.terminal_input(job_id, b"z" * MAX_TERMINAL_INPUT)
    room = h.cl.sessions.input_room(job_id)
    assert room is not None
    n1.disconnect()
    assert room.is_set()  # whoever waited wakes, and finds no terminal to type into
    assert h.cl.sessions.input_room(job_id) is None
