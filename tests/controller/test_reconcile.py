"""Reconcile at an agent's hello, the pure part: what to kill, what is lost, what was never
launched, what to resume (test_agents.py has it as the controller applies it)."""

from __future__ import annotations

import pytest

from factories import master_job
from mgpu.master.control.reconcile import Expected, Reconciliation, expectations, reconcile
from mgpu.master.state.steps import Steps
from mgpu.model import EndReason, Job, JobState, Slot, SlotPhase
from mgpu.protocol import RunningReport


def rep(job_id: str, epoch: int = 1, exited: bool = False) -> RunningReport:
    return RunningReport(job_id=job_id, epoch=epoch, pid=None if exited else 4242, exited=exited)


def ids(reports: tuple[RunningReport, ...]) -> list[tuple[str, int]]:
    return [(r.job_id, r.epoch) for r in reports]


# (case, reports, expected, kill, lost, resume)
CASES = [
    ("nothing on either side", [], {}, [], [], []),
    ("a job running as expected", [rep("j")], {"j": Expected(1)}, [], [], [("j", 1)]),
    ("unknown job: killed", [rep("x")], {}, [("x", 1)], [], []),
    ("unknown job that exited: left alone", [rep("x", exited=True)], {}, [], [], []),
    (
        "stale epoch: the old run is killed, the new one is lost",
        [rep("j", epoch=1)],
        {"j": Expected(2)},
        [("j", 1)],
        ["j"],
        [],
    ),
    (
        "cancelled job still running: killed, its output still taken",
        [rep("j")],
        {"j": Expected(1, stop=True)},
        [("j", 1)],
        [],
        [("j", 1)],
    ),
    (
        "cancelled job that exited: its end is re-sent, nothing to kill",
        [rep("j", exited=True)],
        {"j": Expected(1, stop=True)},
        [],
        [],
        [("j", 1)],
    ),
    (
        "exited run not yet forgotten: neither killed nor lost",
        [rep("j", exited=True)],
        {"j": Expected(1)},
        [],
        [],
        [("j", 1)],
    ),
    (
        "a slot that ended but whose process runs: killed",
        [rep("j")],
        {"j": Expected(1, ended=True)},
        [("j", 1)],
        [],
        [("j", 1)],
    ),
    (
        "a job whose slot is on another node: killed here",
        [rep("j")],
        {"j": Expected(1, here=False, ended=True)},
        [("j", 1)],
        [],
        [],
    ),
    (
        "a step of a live job: kept",
        [rep("j"), rep("j.s1")],
        {"j": Expected(1), "j.s1": Expected(1, step=True)},
        [],
        [],
        [("j", 1), ("j.s1", 1)],
    ),
    (
        "a step that ended: killed",
        [rep("j.s1")],
        {"j.s1": Expected(1, ended=True, step=True)},
        [("j.s1", 1)],
        [],
        [("j.s1", 1)],
    ),
    ("an unknown step: killed", [rep("j.s9")], {}, [("j.s9", 1)], [], []),
    (
        "a live step the agent no longer has: not lost (it ends with its job)",
        [rep("j")],
        {"j": Expected(1), "j.s1": Expected(1, step=True)},
        [],
        [],
        [("j", 1)],
    ),
    ("a lost job", [], {"j": Expected(1)}, [], ["j"], []),
    (
        "a launch that never reached the agent: not lost, unlaunched",
        [],
        {"j": Expected(1, started=False)},
        [],
        [],
        [],
    ),
    (
        "two lost jobs beside one still running",
        [rep("b")],
        {"a": Expected(1), "b": Expected(1), "c": Expected(3)},
        [],
        ["a", "c"],
        [("b", 1)],
    ),
]


@pytest.mark.parametrize(
    ("reports", "expected", "kill", "lost", "resume"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_reconcile(
    reports: list[RunningReport],
    expected: dict[str, Expected],
    kill: list[tuple[str, int]],
    lost: list[str],
    resume: list[tuple[str, int]],
) -> None:
    result = reconcile(reports, expected)
    assert ids(result.kill) == kill
    assert list(result.lost) == lost
    assert list(result.resume) == resume
    unlaunched = [j for j, e in expected.items() if not e.started]
    assert list(result.unlaunched) == unlaunched


def test_a_launch_reported_running_is_resumed_not_unlaunched() -> None:
    result = reconcile([rep("j")], {"j": Expected(1, started=False)})
    assert result.resume == (("j", 1),) and result.unlaunched == () and result.lost == ()


def running(job_id: str, *slots: Slot, epoch: int = 1) -> Job:
    job = master_job(job_id, state=JobState.RUNNING, epoch=epoch)
    job.allocation = list(slots)
    for slot in job.allocation:
        if slot.phase == SlotPhase.PENDING:
            slot.phase = SlotPhase.STARTED
    return job


def test_expectations_from_the_masters_jobs_and_steps() -> None:
    jobs = {
        "live": running("live", Slot("n1", [0])),
        "multi": running(
            "multi", Slot("n2", [0]), Slot("n1", [1], phase=SlotPhase.EXITED), epoch=4
        ),
        "elsewhere": running("elsewhere", Slot("n2", [1])),
        "queued": master_job("queued"),
        "stopping": running("stopping", Slot("n1", [2])),
        "sent": running("sent", Slot("n1", [3], phase=SlotPhase.SENT)),
    }
    jobs["stopping"].stop_reason = EndReason.CANCELLED
    steps = Steps()
    here, there = steps.new("live", 1, "n1"), steps.new("elsewhere", 1, "n2")
    reports = [rep(i) for i in ("multi", "elsewhere", "queued", here.id, there.id, "gone")]
    got = expectations("n1", ["live", "stopping", "sent"], reports, jobs, steps.by_id)
    assert got == {
        "live": Expected(1),
        "stopping": Expected(1, stop=True),
        "sent": Expected(1, started=False),
        "multi": Expected(4, ended=True),
        "elsewhere": Expected(1, here=False, ended=True),
        here.id: Expected(1, step=True),
        there.id: Expected(1, here=False, step=True),
    }
    result = reconcile(reports, got)
    killed = ["multi", "elsewhere", "queued", there.id, "gone"]
    assert ids(result.kill) == [(run_id, 1) for run_id in killed]
    assert result.lost == ("live", "stopping")
    assert result.unlaunched == ("sent",)
    assert result.resume == ((here.id, 1),)
    assert reconcile([], {}) == Reconciliation()
