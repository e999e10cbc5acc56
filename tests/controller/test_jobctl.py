"""Job control in the controller: hold and release, requeue, update, warning signals before
the time limit and at preemption, restart counts, job scripts in the launch, and the
notifications a job's end queues (master/control/jobctl.py, master/control/notify.py)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from harness import Harness, _run
from pydantic import ValidationError

from mgpu.master.control.jobctl import Actor, JobControl, NotAllowed
from mgpu.master.control.nodes import Conflict
from mgpu.master.control.submit import SubmitError
from mgpu.model import DesiredState, EndReason, JobState
from mgpu.protocol import Kill, Launch, SetTimeLimit

ALICE = Actor("alice", admin=False)
BOB = Actor("bob", admin=False)
ADMIN = Actor("root", admin=True)


def update(h: Harness, job_id: str, actor: Actor = ALICE, **values: Any) -> Any:
    raw = {k: values.get(k) for k in ("time", "priority", "gpus", "name")}
    new = JobControl.parse_update(**raw)
    return _run(h.cl.jobctl.update(h.job(job_id), new, actor))


# ---- hold / release ---------------------------------------------------------------


def test_a_held_job_waits_until_released(h: Harness) -> None:
    h.agent("n1")
    job_id = h.submit()
    change = h.cl.jobctl.hold(h.job(job_id), ALICE)
    assert (change.changed, change.message) == (True, f"held {job_id}")
    h.tick()
    job = h.job(job_id)
    assert (job.state, job.reason, job.held_by) == (JobState.QUEUED, "held", "alice")
    assert h.stored(job_id).held  # written with its audit event, before the answer
    assert [(e["actor"], e["target"]) for e in h.events("hold")] == [("alice", job_id)]
    assert h.cl.jobctl.hold(job, ALICE).changed is False  # held already: said, no change
    change = h.cl.jobctl.release(job, ALICE)
    assert change.changed and not h.stored(job_id).held
    h.tick()
    assert h.job(job_id).state == JobState.RUNNING
    assert len(h.events("release")) == 1


def test_submit_hold_queues_it_held(h: Harness) -> None:
    a = h.agent("n1")
    job_id = h.submit(hold=True)
    h.tick()
    assert (h.job(job_id).state, h.job(job_id).reason) == (JobState.QUEUED, "held")
    assert a.launches() == []
    h.cl.jobctl.release(h.job(job_id), ALICE)
    h.tick()
    assert [m.job_id for m in a.launches()] == [job_id]


def test_a_held_array_task_is_passed_over_not_the_others(h: Harness) -> None:
    h.agent("n1", gpus=2)
    array = h.submit(array="0-2")
    h.cl.jobctl.hold(h.job(f"{array}_0"), ALICE)
    h.tick()
    states = [h.job(f"{array}_{i}").state for i in range(3)]
    assert states == [JobState.QUEUED, JobState.RUNNING, JobState.RUNNING]


HOLD_REFUSED = [
    ("running", "is running; only a queued job can be held"),
    ("ended", "has ended (completed); only a queued job can be held"),
]


@pytest.mark.parametrize(("where", "error"), HOLD_REFUSED, ids=[w for w, _ in HOLD_REFUSED])
def test_only_a_queued_job_can_be_held(h: Harness, where: str, error: str) -> None:
    a = h.agent("n1")
    job_id = h.start()
    if where == "ended":
        a.exited(job_id, 0)
    with pytest.raises(Conflict, match=re.escape(error)):
        h.cl.jobctl.hold(h.job(job_id), ALICE)
    assert h.events("hold") == []


def test_an_admins_hold_is_released_by_an_admin_only(h: Harness) -> None:
    h.agent("n1")
    job_id = h.submit(hold=False)
    h.cl.jobctl.hold(h.job(job_id), ADMIN)
    with pytest.raises(NotAllowed, match="was held by root; only an admin releases it"):
        h.cl.jobctl.release(h.job(job_id), ALICE)
    assert h.cl.jobctl.release(h.job(job_id), ADMIN).changed
    assert h.cl.jobctl.release(h.job(job_id), ALICE).changed is False  # not held any more


# ---- requeue and the restart count --------------------------------------------------


def test_requeue_stops_the_run_and_queues_it_again_without_spending_a_retry(h: Harness) -> None:
    a = h.agent("n1")
    job_id = h.submit()
    h.tick()
    (first,) = a.launches()
    assert first.env["MGPU_RESTART_COUNT"] == "0"
    a.started(job_id)
    change = h.cl.jobctl.requeue(h.job(job_id), ALICE)
    assert (change.changed, h.job(job_id).desired) == (True, DesiredState.REQUEUE)
    (kill,) = a.kills()
    assert (kill.reason, kill.signal) == ("requeued", None)
    assert h.events("requeue")[0]["actor"] == "alice"
    a.exited(job_id, 143)
    job = h.job(job_id)
    assert (job.state, job.retries, job.restarts) == (JobState.QUEUED, 0, 1)
    assert job.reason == "requeued: requested by alice"
    assert job.attempts[-1].end_reason == "requested by alice"
    h.tick()
    (second,) = a.launches()
    assert second.env["MGPU_RESTART_COUNT"] == "1"
    assert len(h.job(job_id).attempts) == 2


def test_the_restart_count_counts_every_cause(h: Harness) -> None:
    a = h.agent("n1")
    job_id = h.start()
    h.cl.life.requeue(h.job(job_id), EndReason.NODE_LOST, "lost")  # a retry, and a restart
    h.advance(2)  # its backoff
    h.tick()
    a.started(job_id)
    h.cl.life.requeue(h.job(job_id), EndReason.PREEMPTED, "preempted")  # no retry, a restart
    h.tick()
    launches = a.launches()
    assert [m.env["MGPU_RESTART_COUNT"] for m in launches] == ["0", "1", "2"]
    assert (h.job(job_id).retries, h.job(job_id).restarts) == (1, 2)
    assert h.job(job_id).to_public()["restart_count"] == 2


REQUEUE_CASES: list[tuple[str, Callable[[Harness, str], None], Any]] = [
    ("queued", lambda h, j: None, "is queued already: nothing to requeue"),
    ("being requeued", lambda h, j: h.cl.jobctl.requeue(h.job(j), ALICE), "being requeued already"),
    ("being cancelled", lambda h, j: h.cl.cancel(h.job(j)), Conflict),
    ("ended", lambda h, j: h.agents["n1"].exited(j, 0), Conflict),
]


@pytest.mark.parametrize(
    ("case", "setup", "outcome"), REQUEUE_CASES, ids=[c[0] for c in REQUEUE_CASES]
)
def test_requeue_of_a_job_not_running_as_usual(
    h: Harness, case: str, setup: Callable[[Harness, str], None], outcome: Any
) -> None:
    h.agent("n1")
    job_id = h.submit(hold=True) if case == "queued" else h.start()
    setup(h, job_id)
    if isinstance(outcome, str):
        change = h.cl.jobctl.requeue(h.job(job_id), ALICE)
        assert (change.changed, outcome in change.message) == (False, True)
    else:
        with pytest.raises(outcome):
            h.cl.jobctl.requeue(h.job(job_id), ALICE)


# ---- update ------------------------------------------------------------------------


def test_update_a_queued_job(h: Harness) -> None:
    h.agent("n1", gpus=4)
    job_id = h.submit(hold=True, time="10", priority=1, name="a")
    h.tick()  # its request is cached by the loop now
    change = update(h, job_id, time="5", priority=7, gpus=3, name="b")
    assert change.message == (
        f"updated {job_id}: time 00:10:00 -> 00:05:00; name a -> b; priority 1 -> 7; gpus 1 -> 3"
    )
    stored = h.stored(job_id)
    assert (stored.time_limit, stored.priority, stored.gpus, stored.name) == (300, 7, 3, "b")
    (event,) = h.events("update")
    assert event["detail"] == "time 00:10:00 -> 00:05:00; name a -> b; priority 1 -> 7; gpus 1 -> 3"
    h.cl.jobctl.release(h.job(job_id), ALICE)
    h.tick()
    job = h.job(job_id)
    assert job.state == JobState.RUNNING and len(job.allocation[0].gpu_ids) == 3  # not 1


def test_an_impossible_update_is_refused_as_submit_refuses_it(h: Harness) -> None:
    h.agent("n1", gpus=4)
    job_id = h.submit(hold=True)
    with pytest.raises(SubmitError) as at_submit:
        h.submit(gpus=99)
    with pytest.raises(SubmitError) as at_update:
        update(h, job_id, gpus=99)
    assert str(at_update.value) == str(at_submit.value)
    assert h.job(job_id).gpus == 1 and h.events("update") == []
    with pytest.raises(ValidationError, match="time limit 'soon' is not understood"):
        update(h, job_id, time="soon")
    with pytest.raises(ValueError, match="nothing to change"):
        update(h, job_id)


def test_update_of_a_gang_or_pinned_job(h: Harness) -> None:
    h.agent("n1", gpus=4)
    h.agent("n2", gpus=4)
    gang = h.submit(hold=True, nodes=2, gpus_per_node=1)
    update(h, gang, gpus=6)
    assert (h.job(gang).gpus, h.job(gang).gpus_per_node) == (6, 3)
    with pytest.raises(ValidationError, match="--gpus 5 does not match --nodes 2"):
        update(h, gang, gpus=5)
    pinned = h.submit(hold=True, gpu_ids="0,1")
    with pytest.raises(Conflict, match=r"asked for exact GPUs \(--gpu-ids\)"):
        update(h, pinned, gpus=1)


def test_update_a_running_jobs_time_limit(h: Harness) -> None:
    a = h.agent("n1")
    job_id = h.start(time="10")
    a.link.take()
    update(h, job_id, time="5")  # the owner may lower it
    (limit,) = a.link.take(SetTimeLimit)
    assert (limit.job_id, limit.epoch, limit.time_limit) == (job_id, 1, 300)
    with pytest.raises(NotAllowed, match="only an admin may raise the time limit"):
        update(h, job_id, time="20")
    with pytest.raises(NotAllowed):
        update(h, job_id, time="UNLIMITED")
    update(h, job_id, ADMIN, time="20")
    assert a.link.take(SetTimeLimit)[0].time_limit == 1200
    with pytest.raises(Conflict, match="running: only its --time and --name can change now"):
        update(h, job_id, gpus=2)
    # The agent reconnects: the new limit is sent again, after its welcome.
    a.hello(running=[a.running(job_id)])
    assert [m.time_limit for m in a.link.take(SetTimeLimit)] == [1200]


def test_a_site_limit_binds_a_running_update_too(make_harness: Callable[..., Harness]) -> None:
    h = make_harness({"site": {"admission": {"max_time_per_job": "30"}}})
    h.agent("n1")
    job_id = h.start(time="10")
    with pytest.raises(SubmitError, match="more than this cluster allows per job"):
        update(h, job_id, ADMIN, time="60")


# ---- --signal and preemption ---------------------------------------------------------


def test_the_launch_carries_the_signal_and_the_script(h: Harness) -> None:
    a = h.agent("n1")
    spec = {"script": "#!/bin/sh\necho hi\n", "script_name": "job.sh", "argv": ["x", "y"]}
    job_id = h.submit(command=None, signal="B:USR2@30", time="5", **spec)  # type: ignore[arg-type]
    h.tick()
    (launch,) = a.launches()
    assert isinstance(launch, Launch)
    assert (launch.signal, launch.signal_lead, launch.signal_batch) == (12, 30.0, True)
    assert (launch.script, launch.script_name, launch.argv) == (
        spec["script"],
        "job.sh",
        ["x", "y"],
    )
    assert h.job(job_id).command == "job.sh x y"


PREEMPT_WARNINGS = [
    ("none", {}, {}, (None, 0.0, False)),
    ("cluster default", {"scheduling": {"preempt_signal": "USR1@30"}}, {}, (10, 30.0, False)),
    (
        "its own --signal",
        {"scheduling": {"preempt_signal": "USR1@30"}},
        {"signal": "B:USR2@5"},
        (12, 5.0, True),
    ),
]


@pytest.mark.parametrize(
    ("case", "config", "fields", "warning"), PREEMPT_WARNINGS, ids=[c[0] for c in PREEMPT_WARNINGS]
)
def test_a_preempted_job_is_warned_first_and_requeued_free(
    make_harness: Callable[..., Harness],
    case: str,
    config: dict[str, Any],
    fields: dict[str, Any],
    warning: tuple[Any, float, bool],
) -> None:
    h = make_harness(config)
    a = h.agent("n1", gpus=1)
    low = h.start(preemptible=True, **fields)
    a.link.take()
    h.submit(priority=1000)
    h.tick()
    (kill,) = a.link.take(Kill)
    assert (kill.job_id, kill.reason) == (low, "preempted")
    assert (kill.signal, kill.signal_lead, kill.signal_batch) == warning
    a.exited(low, 0)  # it saved its work and left on its own
    job = h.job(low)
    assert (job.state, job.retries, job.restarts) == (JobState.QUEUED, 0, 1)


def test_signal_options_are_checked_at_submit(h: Harness) -> None:
    h.agent("n1")
    with pytest.raises(ValidationError, match="SIGKILL cannot be caught"):
        h.submit(signal="KILL@10")
    with pytest.raises(ValidationError, match="would come 600 s before the end of a job of"):
        h.submit(signal="USR1@600", time="5")
    with pytest.raises(ValidationError, match="a job script cannot run in --image"):
        h.submit(command=None, script="#!/bin/sh\n", image="alpine")  # type: ignore[arg-type]
    assert h.store.count_by_state() == {}


# ---- notifications ---------------------------------------------------------------------


def queued(h: Harness) -> list[Any]:
    return list(h.cl.notifier.waiting())


def test_a_jobs_end_queues_its_notification(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness({"notify": {"allowed_hosts": ["hooks.example.org"]}})
    a = h.agent("n1")
    job_id = h.start(notify="https://hooks.example.org/T/B/secret", name="train")
    h.advance(3723)
    a.exited(job_id, 3)
    (delivery,) = queued(h)
    assert delivery.target.host == "hooks.example.org" and delivery.checked
    assert delivery.body == {
        "job_id": job_id,
        "name": "train",
        "user": "alice",
        "state": "failed",
        "exit_code": 3,
        "reason": "exit code 3",
        "text": f"Job {job_id} (train) of alice failed with exit code 3 after 1h 2m on n1.",
    }
    assert h.job(job_id).to_public()["notify"] == "https://hooks.example.org/..."  # not the path


def test_the_cluster_webhook_is_the_default_and_none_opts_out(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness({"notify": {"webhook": "http://127.0.0.1:9/hook"}})
    h.agent("n1")
    told = h.submit()
    quiet = h.submit(notify="none")
    h.cl.cancel(h.job(told))
    h.cl.cancel(h.job(quiet))
    (delivery,) = queued(h)
    assert delivery.body["job_id"] == told and not delivery.checked  # the admin's own choice
    assert delivery.body["text"] == f"Job {told} of alice was cancelled before it started."


def test_an_array_is_told_once_when_its_last_task_ends(h: Harness) -> None:
    a = h.agent("n1", gpus=4)
    array = h.submit(array="0-2", notify="https://hooks.example.org/x")
    h.tick()
    for i, code in enumerate((0, 1)):
        a.started(f"{array}_{i}")
        a.exited(f"{array}_{i}", code)
        assert queued(h) == []
    a.started(f"{array}_2")
    a.exited(f"{array}_2", 0)
    (delivery,) = queued(h)
    assert (delivery.array_id, delivery.body["job_id"]) == (array, array)


NOTIFY_REFUSED = [
    ({}, "ftp://example.org/x", "only http://, https:// or mailto: targets are sent"),
    ({}, "http://127.0.0.1:8080/api", "is a loopback, link-local or private address"),
    ({}, "http://169.254.169.254/latest/meta-data", "is a loopback, link-local or private"),
    ({}, "http://[::1]/x", "is a loopback, link-local or private address"),
    ({}, "http://10.1.2.3/x", "is a loopback, link-local or private address"),
    ({}, "http://localhost:9000/x", "is a loopback, link-local or private address"),
    ({}, "mailto:alice@example.org", "this cluster sends no e-mail (no notify.smtp"),
    ({}, "https://", "names no host"),
    (
        {"allowed_hosts": ["hooks.slack.com", "*.lab.example"]},
        "https://evil.example.org/x",
        "evil.example.org is not a host this cluster sends notifications to",
    ),
]


@pytest.mark.parametrize(("config", "target", "error"), NOTIFY_REFUSED)
def test_notify_targets_the_cluster_does_not_allow_are_refused_at_submit(
    make_harness: Callable[..., Harness], config: dict[str, Any], target: str, error: str
) -> None:
    h = make_harness({"notify": config})
    h.agent("n1")
    with pytest.raises((SubmitError, ValidationError), match=re.escape(error)):
        h.submit(notify=target)
    assert h.store.count_by_state() == {}


def test_allowed_hosts_may_name_a_private_one(make_harness: Callable[..., Harness]) -> None:
    h = make_harness({"notify": {"allowed_hosts": ["127.0.0.1", "*.lab.example"]}})
    h.agent("n1")
    h.submit(notify="http://127.0.0.1:9000/hook")
    h.submit(notify="https://chat.lab.example/hook")
    assert h.store.count_by_state() == {"queued": 2}


# ---- a job or an array's tasks, through the controller's API (control/bulk.py) --------


def test_an_arrays_active_tasks_are_held_with_one_audit_event(h: Harness) -> None:
    array_id = h.submit(array="0-119")
    alice = Actor("alice", admin=False, address="10.0.0.7")
    changes = _run(h.cl.control_job(array_id, "hold", alice))
    assert [c.job_id for c in changes] == [f"{array_id}_{i}" for i in range(120)]
    assert all(c.changed for c in changes)
    assert all(h.stored(f"{array_id}_{i}").held for i in (0, 119))  # written, not just changed
    events = [(e["actor"], e["address"], e["target"]) for e in h.events("hold")]
    assert events == [("alice", "10.0.0.7", array_id)]  # one for the request, not per task
    again = _run(h.cl.control_job(array_id, "hold", alice))
    assert [c.changed for c in again] == [False] * 120  # said per task, nothing changed


def test_a_task_that_cannot_be_changed_says_why_and_a_job_alone_is_refused(h: Harness) -> None:
    h.agent("n1", gpus=1)
    array_id = h.submit(array="0-1")
    h.tick()  # task 0 runs, task 1 waits
    changes = _run(h.cl.control_job(array_id, "hold", ALICE))
    assert [(c.job_id, c.changed) for c in changes] == [
        (f"{array_id}_0", False),
        (f"{array_id}_1", True),
    ]
    assert "is running; only a queued job can be held" in changes[0].message
    with pytest.raises(Conflict, match="is running"):
        _run(h.cl.control_job(f"{array_id}_0", "hold", ALICE))


def test_another_users_array_is_refused_naming_the_task(h: Harness) -> None:
    array_id = h.submit(array="0-2")
    with pytest.raises(NotAllowed, match=f"job {array_id}_0 belongs to alice") as refused:
        _run(h.cl.control_job(array_id, "requeue", BOB))
    assert refused.value.target == f"requeue {array_id}_0"
    assert not any(h.job(f"{array_id}_{i}").held for i in range(3))
    with pytest.raises(NotAllowed) as refused:
        _run(h.cl.cancel_job(array_id, BOB))
    assert refused.value.target == f"cancel {array_id}_0"
    assert {h.job(f"{array_id}_{i}").state for i in range(3)} == {JobState.QUEUED}


def test_an_array_is_cancelled_whole_with_one_audit_event(h: Harness) -> None:
    array_id = h.submit(array="0-199")
    before = h.submit()
    h.cl.cancel(h.job(f"{array_id}_7"))
    done = _run(h.cl.cancel_job(array_id, ALICE))
    ids = [f"{array_id}_{i}" for i in range(200)]
    assert done.array and list(done.already_ended) == [ids[7]]
    assert list(done.cancelled) == ids[:7] + ids[8:]  # in index order
    assert h.stored(ids[-1]).state == JobState.CANCELLED
    # One event for the request (the task cancelled before had its own).
    assert sorted(e["target"] for e in h.events("cancel")) == [array_id, ids[7]]
    single = _run(h.cl.cancel_job(before, ALICE))
    assert (single.array, single.cancelled, single.already_ended) == (False, (before,), ())


def test_a_missing_job_or_array_is_not_found(h: Harness) -> None:
    from mgpu.master.control.nodes import NotFound

    for job_id in ("nosuchjob", "a1b2c3d4"):  # neither a job nor an array
        with pytest.raises(NotFound):
            _run(h.cl.cancel_job(job_id, ALICE))
        with pytest.raises(NotFound):
            _run(h.cl.control_job(job_id, "hold", ALICE))


def test_array_work_is_written_a_slice_at_a_time_once_its_budget_is_spent(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one slicing policy (control/bulk.py): with no time to spare, every slice is
    written as it is done; the request's audit event goes with the first write only."""
    from mgpu.master.control import bulk

    monkeypatch.setattr(bulk, "BUDGET", 0.0)
    writes: list[Any] = []
    commit = h.cl.commit
    monkeypatch.setattr(
        h.cl, "commit", lambda event, detail=None: writes.append(event) or commit(event, detail)
    )
    array_id = h.submit(array=f"0-{2 * bulk.SLICE + 9}")  # three slices
    _run(h.cl.control_job(array_id, "hold", ALICE))
    assert writes == [("hold", "alice", None, array_id), None, None]
    writes.clear()
    _run(h.cl.cancel_job(array_id, ALICE))
    assert writes == [("cancel", "alice", None, array_id), None, None]


def test_an_array_release_is_all_or_nothing(h: Harness) -> None:
    """Issue 25: `mgpu release ARRAY` answered 403 yet released the tasks the user had held;
    every task is checked first, so a refusal changes nothing."""
    array_id = h.submit(array="0-119")
    ids = [f"{array_id}_{i}" for i in range(120)]
    _run(h.cl.control_job(array_id, "hold", ALICE))
    h.cl.jobctl.release(h.job(ids[100]), ADMIN)
    h.cl.jobctl.hold(h.job(ids[100]), ADMIN)  # one task held by an admin, far down the array
    with pytest.raises(NotAllowed, match=f"job {ids[100]} was held by root") as refused:
        _run(h.cl.control_job(array_id, "release", ALICE))
    assert refused.value.target == f"release {array_id}"
    assert all(h.job(i).held for i in ids)  # none released
    assert len(h.events("release")) == 1  # the admin's own, nothing for the refused request
    changes = _run(h.cl.control_job(array_id, "release", ADMIN))
    assert sum(c.changed for c in changes) == 120


def test_an_array_update_is_all_or_nothing(h: Harness) -> None:
    h.agent("n1", gpus=1)
    array_id = h.submit(array="0-2", time="10:00")
    h.cl.jobctl.hold(h.job(f"{array_id}_0"), ALICE)
    h.tick()  # task 1 runs: queued task 0 comes before it
    assert h.job(f"{array_id}_1").state == JobState.RUNNING
    new = JobControl.parse_update(time="1:00:00", priority=None, gpus=None, name=None)
    with pytest.raises(NotAllowed, match="only an admin may raise the time limit"):
        _run(h.cl.control_job(array_id, "update", ALICE, new))
    assert {h.job(f"{array_id}_{i}").time_limit for i in range(3)} == {600.0}
