"""`scancel --signal` in the controller (master/control/jobctl.py `signal`): what is sent
to which agent, as Slurm's -b/-f decide, and a pending job refused; and an array task found
by its own job number (Slurm's: task 4 of array 1234 is also job 1238)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from harness import Harness, _run
from test_api import _call

from mgpu.config import ClusterConfig
from mgpu.master.control.jobctl import Actor, NotAllowed, SignalAsked, signal_number
from mgpu.master.control.nodes import Conflict
from mgpu.master.control.srun import SrunRequest
from mgpu.master.http.app import create_app
from mgpu.protocol import SignalRun
from mgpu.spec import SpecError

ALICE = Actor("alice", admin=False)
BOB = Actor("bob", admin=False)
USR1 = 10


def _signal(h: Harness, job_id: str, actor: Actor = ALICE, **how: bool) -> list[tuple[str, bool]]:
    changes = _run(h.cl.signal_job(job_id, SignalAsked(USR1, **how), actor))
    h.settle()
    return [(c.job_id, c.changed) for c in changes]


def _sent(h: Harness, node_id: str) -> list[tuple[str, int, bool]]:
    return [(m.job_id, m.signal, m.top_only) for m in h.agents[node_id].link.take(SignalRun)]


def test_a_running_jobs_processes_get_the_signal_and_it_is_audited(h: Harness) -> None:
    h.agent("n1")
    job_id = h.start("sleep 100")
    assert _signal(h, job_id) == [(job_id, True)]
    assert _sent(h, "n1") == [(job_id, USR1, False)]
    assert h.job(job_id).state.value == "running"  # a signal is not a cancel
    (event,) = h.events("signal")
    assert (event["actor"], event["target"]) == ("alice", job_id)
    with pytest.raises(NotAllowed):
        _signal(h, job_id, BOB)
    assert _sent(h, "n1") == []


def test_a_pending_or_ended_job_is_refused_in_slurms_words(h: Harness) -> None:
    queued = h.submit()  # no node: it waits
    with pytest.raises(Conflict, match=f"job {queued}: Job is pending execution"):
        _signal(h, queued)
    h.cl.cancel(h.job(queued))
    with pytest.raises(Conflict, match="already completing or completed"):
        _signal(h, queued)


def test_a_batch_job_as_slurm_its_steps_b_its_shell_f_everything(h: Harness) -> None:
    n1 = h.agent("n1")
    h.agent("n2")
    job_id = h.submit("sleep 100", nodes=2, gpus_per_node=1, slurm={"batch": True})
    h.tick()
    if n1.port_requests():
        n1.port(job_id)
    n1.started(job_id)
    assert _signal(h, job_id) == [(job_id, True)]  # no step yet: Slurm spares the script
    assert _sent(h, "n1") == [] and _sent(h, "n2") == []
    group, _ = h.cl.allocations.sruns.start(job_id, SrunRequest(argv=["sleep", "9"], env={}))
    h.settle()
    tasks = [f"{group.id}.0", f"{group.id}.1"]
    _signal(h, job_id)
    assert _sent(h, "n1") == [(tasks[0], USR1, False)]
    assert _sent(h, "n2") == [(tasks[1], USR1, False)]
    _signal(h, job_id, batch_only=True)  # -b: the script's shell, on the first node
    assert (_sent(h, "n1"), _sent(h, "n2")) == ([(job_id, USR1, True)], [])
    _signal(h, job_id, full=True)  # -f: the script and its children, and the steps
    assert _sent(h, "n1") == [(job_id, USR1, False), (tasks[0], USR1, False)]
    assert _sent(h, "n2") == [(tasks[1], USR1, False)]


def test_an_arrays_running_tasks_are_signalled_its_pending_ones_said(h: Harness) -> None:
    h.agent("n1", gpus=1)
    array_id = h.submit("sleep 100", array="0-1")
    h.tick()
    h.agents["n1"].started(f"{array_id}_0")
    assert _signal(h, array_id) == [(f"{array_id}_0", True), (f"{array_id}_1", False)]
    assert _sent(h, "n1") == [(f"{array_id}_0", USR1, False)]
    assert [e["target"] for e in h.events("signal")] == [array_id]


def test_signal_names_and_numbers() -> None:
    assert signal_number("USR1") == signal_number("sigusr1") == signal_number(10) == 10
    assert signal_number("9") == 9
    for bad in ("NOPE", 0, 999, "RTMIN"):
        with pytest.raises(SpecError):
            signal_number(bad)


def test_an_array_task_is_found_by_its_own_number(h: Harness) -> None:
    before = h.submit()
    array_id = h.submit(array="0,2-4")
    after = h.submit()
    base = int(array_id)
    assert int(after) == base + 5  # the array's block of numbers is its tasks'
    assert h.job(str(base + 3)).id == f"{array_id}_3"
    assert h.cl.get_job(array_id) is None  # the array's own id stays the array's
    assert h.cl.get_job(str(base + 1)) is None  # no task 1
    assert h.job(before).id == before and h.job(after).id == after
    h.cl.cancel(h.job(f"{array_id}_4"))
    h.crash()  # ended and written: found in the store the same way
    assert h.job(str(base + 4)).state.value == "cancelled"
    assert h.cl.task_of_number("99999") is None


def test_the_signal_route_answers_each_refusal_with_its_status(tmp_path: Path) -> None:
    """POST /api/jobs/{id}/signal: a pending job 409 (Slurm's words), a bad signal 422, a
    stranger 403, an unknown job 404."""
    app = create_app(tmp_path, ClusterConfig())

    async def main() -> dict[str, Any]:
        async with app.router.lifespan_context(app):
            admin = (tmp_path / "admin-token").read_text().strip()
            status, made = await _call(app, "POST", "/api/jobs", admin, b'{"command": "true"}')
            assert status == 201
            path = f"/api/jobs/{made['job_id']}/signal"
            _, bob = await _call(app, "POST", "/api/tokens", admin, b'{"user": "bob"}')
            return {
                "id": made["job_id"],
                "pending": await _call(app, "POST", path, admin, b'{"signal": "USR1"}'),
                "bad": await _call(app, "POST", path, admin, b'{"signal": "NOPE"}'),
                "flag": await _call(app, "POST", path, admin, b'{"signal": 10, "full": 1}'),
                "bob": await _call(app, "POST", path, bob["token"], b'{"signal": 10}'),
                "none": await _call(
                    app, "POST", "/api/jobs/99999/signal", admin, b'{"signal": 10}'
                ),
            }

    out = asyncio.run(main())
    assert out["pending"] == (409, {"detail": f"job {out['id']}: Job is pending execution"})
    assert out["bad"][0] == 422 and "is not a signal name" in out["bad"][1]["detail"]
    assert out["flag"][0] == 422  # flags are true or false, nothing else
    assert out["bob"][0] == 403 and out["none"][0] == 404
