"""Steps outlive their master (master/control/livesteps.py): a master that starts again on
the same store (or takes over from a killed leader) knows the steps of the running jobs,
ended or not; the agents' processes of them are resumed, not killed as unknown; a process
no agent has any more (its launch died with the old master) ends, so the step ends and its
srun client is told; and a job's steps are forgotten with it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from harness import FakeAgent, Harness

from mgpu.master.control.allocations import StepRequest
from mgpu.master.control.jobctl import Actor
from mgpu.master.control.requestkeys import Answer, RequestKeys
from mgpu.master.control.srun import SrunRequest
from mgpu.model import JobState
from mgpu.protocol import RunningReport

KEY = "0123456789abcdef0123456789abcdef"


def _batch(h: Harness) -> tuple[str, FakeAgent, FakeAgent]:
    n1, n2 = h.agent("n1"), h.agent("n2")
    job_id = h.submit("sleep 100", nodes=2, gpus_per_node=2, slurm={"batch": True})
    h.tick()
    if n1.port_requests():
        n1.port(job_id)
    n1.started(job_id)
    return job_id, n1, n2


def _report(step_id: str, epoch: int, exited: bool = False) -> RunningReport:
    return RunningReport(job_id=step_id, epoch=epoch, pid=None if exited else 7, exited=exited)


def test_an_srun_step_goes_on_under_a_master_that_took_over(h: Harness) -> None:
    job_id, n1, n2 = _batch(h)
    group, _ = h.cl.allocations.sruns.start(job_id, SrunRequest(argv=["train"], env={}))
    h.settle()
    t0, t1 = group.tasks
    n1.exited(t0.id, 0, epoch=t0.epoch)  # one task ended (and is forgotten) before the kill
    n2.output(t1.id, "half way\n", epoch=t1.epoch)
    epoch = t1.epoch

    h.crash()
    again = h.cl.srun_step(group.id)
    assert again is not None and not again.done, "the new master does not know the step"
    assert again.tasks[0].done and again.tasks[0].exit_code == 0
    assert (again.number, again.name) == (group.number, "train")
    n1.hello([n1.running(job_id)])  # its task was forgotten: not lost, it had ended
    n2.hello([_report(t1.id, epoch)])
    assert n2.kills() == [], "the step's running task was killed as unknown"
    assert not again.done
    n2.exited(t1.id, 3, epoch=epoch)
    assert again.done and again.exit_code == 3
    assert [s["number"] for s in h.store.steps_of([job_id])[job_id]] == [group.number]
    # A step started now numbers on from the restored one.
    later, _ = h.cl.allocations.sruns.start(job_id, SrunRequest(argv=["eval"], env={}))
    assert later.number == group.number + 1 and later.id != group.id


def test_an_allocations_step_goes_on_and_one_never_launched_ends(h: Harness) -> None:
    n1 = h.agent("n1")
    job_id = h.submit("bash", allocation=True, gpus=2)
    h.tick()
    step = h.cl.allocations.start_step(job_id, StepRequest(argv=["python"], env={}))
    lost = h.cl.allocations.start_step(job_id, StepRequest(argv=["python"], env={}))
    h.settle()

    h.crash()
    assert h.cl.step(step.id) is not None and h.cl.step(lost.id) is not None
    n1.hello([_report(step.id, step.epoch)])  # the second one's launch never reached it
    assert n1.kills() == []
    gone = h.cl.step(lost.id)
    assert gone is not None and gone.done and gone.exit_code is None
    assert gone.error is not None and "n1 lost it" in gone.error
    kept = h.cl.step(step.id)
    assert kept is not None and not kept.done
    n1.exited(step.id, 0, epoch=step.epoch)
    assert kept.done and kept.exit_code == 0


def test_a_jobs_steps_are_forgotten_with_it(h: Harness) -> None:
    job_id, n1, _ = _batch(h)
    h.cl.allocations.sruns.start(job_id, SrunRequest(argv=["train"], env={}))
    h.settle()
    assert [row[1] for row in h.store.live_steps()] == [job_id]
    h.cl.cancel(h.job(job_id))
    n1.exited(job_id, 143)
    h.settle()
    assert h.job(job_id).state == JobState.CANCELLED
    assert h.store.live_steps() == []
    h.crash()
    assert h.cl.steps.by_id == {}


def test_a_job_that_never_had_a_step_asks_no_step_rows_gone(h: Harness) -> None:
    """A job's end deletes its live steps' rows only if it had steps: most jobs never have
    one, and the delete was a statement per job (a round of a PostgreSQL transaction)."""
    asked: list[list[str]] = []
    save = h.store.save_jobs_later

    def spy(*args: object, **kwargs: object) -> object:
        asked.append(list(kwargs.get("gone_steps") or ()))  # type: ignore[call-overload]
        return save(*args, **kwargs)  # type: ignore[arg-type]

    h.store.save_jobs_later = spy  # type: ignore[method-assign]
    n1 = h.agent("n1")
    plain = h.submit("true", gpus=1)
    h.tick()
    n1.started(plain)
    n1.exited(plain, 0)
    h.settle()
    assert h.job(plain).state == JobState.COMPLETED
    assert not any(asked), asked
    stepped, n1b, _ = _batch(h)
    h.cl.allocations.sruns.start(stepped, SrunRequest(argv=["train"], env={}))
    h.settle()
    h.cl.cancel(h.job(stepped))
    n1b.exited(stepped, 143)
    h.settle()
    assert [stepped] in asked


def test_a_keyed_steps_start_and_its_answer_are_one_write(h: Harness) -> None:
    """A step started with an Idempotency-Key (srun after a lost answer sends it again) is
    written with its answer, in one transaction: a master killed between two writes would
    have left the step without the answer, and the start sent again made a second step."""
    job_id, _, _ = _batch(h)
    h.settle()
    writes: list[str] = []
    write = h.store._write_rows  # type: ignore[attr-defined]

    def recorded(parts: Any) -> None:
        writes.append(str(parts))
        write(parts)

    h.store._write_rows = recorded  # type: ignore[attr-defined]
    keys = RequestKeys(h.store, h.cl.uow)

    async def start() -> Answer:
        request = SrunRequest(argv=["train"], env={})
        group, _ = h.cl.start_srun(job_id, request, Actor("root", admin=True))
        return Answer(201, "application/json", json.dumps({"step_id": group.id}).encode())

    made = asyncio.run(keys.once("root", KEY, "POST srun", start))
    step_id = json.loads(made.body)["step_id"]
    with_step = [w for w in writes if "live_steps" in w and step_id in w]
    assert with_step, writes
    assert "request_keys" in with_step[0] and KEY in with_step[0]
    again = asyncio.run(keys.once("root", KEY, "POST srun", start))  # sent again
    assert again == made
    assert [r for r in h.store.live_steps() if r[0].startswith(step_id)]
    assert len(h.cl.steps.groups) == 1
