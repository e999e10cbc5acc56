"""Admin reservations: windows kept free, their own jobs inside them, choosing their GPUs."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from factories import HOUR, job, node, running
from mgpu.scheduler import (
    Decisions,
    JobRequest,
    NodeView,
    Placement,
    Reservation,
    ReservationError,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    could_fit_reservation,
    pick_reservation_gpus,
    schedule,
)

NOW = 50_000.0


def reservation(
    name: str = "course-a",
    gpus: tuple[int, ...] = (0, 1, 2, 3),
    starts_in: float = HOUR,
    lasts: float = 2 * HOUR,
    nid: str = "n1",
) -> Reservation:
    return Reservation(name, (Placement(nid, gpus),), NOW + starts_in, NOW + starts_in + lasts)


def run(
    nodes: list[NodeView],
    pending: list[JobRequest],
    reservations: list[Reservation],
    running_jobs: Iterable[RunningJob] = (),
    **config: object,
) -> Decisions:
    config.setdefault("preemption", False)
    return schedule(
        Snapshot(
            NOW,
            nodes,
            pending,
            tuple(running_jobs),
            config=SchedulerConfig(**config),  # type: ignore[arg-type]
            reservations=reservations,
        )
    )


def started(d: Decisions) -> dict[str, tuple[tuple[str, tuple[int, ...]], ...]]:
    return {s.job_id: tuple((p.node_id, p.gpu_ids) for p in s.placements) for s in d.starts}


# --------------------------------------------------------------------------- before the window


@pytest.mark.parametrize("starts_in", [30.0, HOUR, 25 * HOUR, 400 * 24 * HOUR])
def test_a_job_without_a_time_limit_never_takes_reserved_gpus(starts_in: float) -> None:
    # Nothing ends it at the default limit (24 h): however far off the window, it would
    # still hold the GPUs then.  A 1 h job that ends first may use them meanwhile.
    res = reservation(starts_in=starts_in)
    d = run(
        [node("n1")],
        [job("unlimited", gpus=4), job("share", gpu_share=500), job("hour", time_limit=HOUR)],
        [res],
    )
    assert "unlimited" not in started(d) and "share" not in started(d)
    assert d.reasons["unlimited"].startswith("waiting for 4 GPUs (reservation course-a takes")
    assert ("hour" in started(d)) is (starts_in >= HOUR)


def test_an_unlimited_head_is_planned_after_every_window_on_its_gpus() -> None:
    # Blocked by a running job, the head's planned start must not be one that runs it into
    # the reservation on the GPUs it would get.
    busy = running("r", "n2", (0, 1), now=NOW, ends_in=HOUR / 2)
    d = run(
        [node("n1", gpus=2), node("n2", (), gpus=2)],
        [job("big", gpus=2)],
        [reservation(gpus=(0, 1), starts_in=10 * 24 * HOUR)],
        [busy],
    )
    assert started(d) == {}
    assert d.expected_start["big"] == NOW + HOUR / 2  # on n2, not on the reserved n1


@pytest.mark.parametrize(
    ("limit", "starts"),
    [
        (HOUR / 2, True),  # ends before the window opens
        (HOUR, True),  # ends exactly as it opens
        (HOUR + 1, False),  # would still run when it opens
        (None, False),  # the default limit (24 h) runs into it
    ],
)
def test_a_job_may_use_reserved_gpus_only_if_it_ends_before_the_window(
    limit: float | None, starts: bool
) -> None:
    d = run([node("n1")], [job("j", gpus=2, time_limit=limit)], [reservation()])
    assert ("j" in started(d)) is starts
    if not starts:
        assert d.reasons["j"] == "waiting for 2 GPUs (reservation course-a takes 4 GPUs in 1h)"
        # It can start once the window is over (no running job holds the node meanwhile).
        assert d.expected_start["j"] == NOW + 3 * HOUR
        assert d.waiting_on["j"] == ("reservation:course-a",)


def test_unreserved_gpus_stay_usable_and_the_reason_says_gpus_when_they_are_busy() -> None:
    nodes = [node("n1", (0, 1, 2, 3), gpus=6)]  # GPUs 4, 5 busy for 3 hours
    busy = [running("r", "n1", (4, 5), now=NOW, ends_in=3 * HOUR)]
    d = run(nodes, [job("j", gpus=1, time_limit=10 * HOUR)], [reservation(gpus=(0, 1, 2, 3))], busy)
    assert "j" not in started(d)
    assert d.reasons["j"] == "waiting for 1 GPU (reservation course-a takes 4 GPUs in 1h)"
    d = run(nodes, [job("j", gpus=1, time_limit=10 * HOUR)], [reservation(gpus=(0, 1, 2))], busy)
    assert started(d) == {"j": (("n1", (3,)),)}


# --------------------------------------------------------------------------- inside the window


def test_inside_the_window_only_its_own_jobs_run_and_only_on_its_gpus() -> None:
    nodes = [node("n1", gpus=8)]
    active = reservation(gpus=(0, 1, 2, 3), starts_in=-HOUR, lasts=3 * HOUR)
    pending = [
        job("mine", gpus=2, reservation="course-a"),
        job("other", gpus=6, submit=1.0, time_limit=HOUR),  # 6 are free, 2 of them reserved
        job("too-big", gpus=6, submit=2.0, reservation="course-a"),
        job("small", gpus=4, submit=3.0, time_limit=HOUR),
    ]
    d = run(nodes, pending, [active])
    assert started(d) == {"mine": (("n1", (0, 1)),), "small": (("n1", (4, 5, 6, 7)),)}
    assert d.reasons["other"] == (
        "waiting for 6 GPUs (reservation course-a holds 4 GPUs for another 2h)"
    )
    assert d.expected_start["other"] == NOW + 2 * HOUR  # when the window closes
    assert d.reasons["too-big"] == (
        "reservation course-a cannot run it: no node has 6 GPUs (the largest has 4); "
        "use --nodes/--gpus-per-node or --distributed to span nodes"
    )


def test_a_reservation_job_waits_for_its_window_and_for_its_gpus() -> None:
    nodes = [node("n1")]
    future = reservation(starts_in=HOUR)
    d = run(nodes, [job("early", gpus=1, reservation="course-a")], [future])
    assert d.starts == []
    assert d.reasons["early"] == "waiting for reservation course-a, which starts in 1h"
    assert d.expected_start["early"] == NOW + HOUR
    assert d.waiting_on["early"] == ("reservation:course-a",)

    active = reservation(gpus=(0, 1), starts_in=0.0)
    busy = [running("r", "n1", (0,), now=NOW, ends_in=HOUR / 2)]
    d = run([node("n1", (1, 2, 3))], [job("m", gpus=2, reservation="course-a")], [active], busy)
    assert d.reasons["m"] == "waiting for 2 GPUs of reservation course-a"
    assert d.expected_start["m"] == NOW + HOUR / 2
    assert d.waiting_on["m"] == ("r",)


def test_a_job_of_an_unknown_reservation_never_starts_nor_blocks_the_queue() -> None:
    for reservations in ([], [reservation(name="other")]):
        d = run(
            [node("n1")],
            [
                job("lost", gpus=1, reservation="gone"),
                job("next", gpus=1, submit=1.0, time_limit=60.0),
            ],
            reservations,
            queue_policy="fifo",
        )
        assert set(started(d)) == {"next"}
        assert d.reasons["lost"] == "reservation gone does not exist or has ended"
        assert "lost" not in d.expected_start


def test_reservation_jobs_are_not_held_behind_a_blocked_fifo_head() -> None:
    nodes = [node("n1", (2, 3))]
    busy = [running("r", "n1", (0, 1), now=NOW, ends_in=HOUR)]
    active = reservation(gpus=(2, 3), starts_in=0.0)
    pending = [job("head", gpus=4), job("mine", gpus=2, submit=1.0, reservation="course-a")]
    d = run(nodes, pending, [active], busy, queue_policy="fifo")
    assert started(d) == {"mine": (("n1", (2, 3)),)}


def test_shares_of_a_reservation_pack_on_its_gpus() -> None:
    active = reservation(gpus=(1,), starts_in=0.0)
    pending = [
        JobRequest("s1", "alice", 0.0, gpu_share=500, reservation="course-a"),
        JobRequest("s2", "alice", 1.0, gpu_share=500, reservation="course-a"),
        JobRequest("s3", "alice", 2.0, gpu_share=500, reservation="course-a", time_limit=HOUR),
    ]
    d = run([node("n1", gpus=2)], pending, [active])
    assert {s.job_id: s.placements[0] for s in d.starts} == {
        "s1": Placement("n1", (1,), 500),
        "s2": Placement("n1", (1,), 500),
    }
    assert d.reasons["s3"] == "waiting for 0.5 of one GPU of reservation course-a"


# --------------------------------------------------------------------------- backfill


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        (HOUR, NOW + HOUR),  # runs [1h, 2h): ends as the window opens
        (2 * HOUR, NOW + 4 * HOUR),  # would overlap the window: after it
    ],
)
def test_the_heads_reservation_avoids_the_window(limit: float, expected: float) -> None:
    nodes = [node("n1", (2, 3))]
    busy = [running("r", "n1", (0, 1), now=NOW, ends_in=HOUR)]
    window = reservation(gpus=(2, 3), starts_in=2 * HOUR, lasts=2 * HOUR)
    d = run(nodes, [job("head", gpus=4, time_limit=limit)], [window], busy)
    assert d.expected_start["head"] == expected


def test_backfill_respects_both_the_head_and_the_reservation() -> None:
    nodes = [node("n1", (2, 3)), node("n2")]
    busy = [running("r", "n1", (0, 1), now=NOW, ends_in=HOUR)]
    window = reservation(gpus=(0, 1, 2, 3), starts_in=2 * HOUR, nid="n2")
    pending = [
        job("head", gpus=4, priority=100, time_limit=3 * HOUR),  # not n2 (window): n1 at +1h
        job("fits-n2", gpus=2, submit=1.0, time_limit=HOUR),  # n2, done before the window
        job("long", gpus=2, submit=2.0, time_limit=5 * HOUR),  # nowhere: head's n1, window's n2
    ]
    d = run(nodes, pending, [window], busy)
    assert d.expected_start["head"] == NOW + HOUR
    assert started(d) == {"fits-n2": (("n2", (0, 1)),)}
    assert "long" not in started(d)


# --------------------------------------------------------------------------- choosing GPUs


def pick(
    gpus: int, starts_in: float = HOUR, lasts: float = HOUR, **kw: object
) -> tuple[Placement, ...]:
    kw.setdefault("nodes", [node("n1"), node("n2", (0, 1))])
    kw.setdefault("running", [running("r", "n2", (2, 3), now=NOW, ends_in=3 * HOUR)])
    kw.setdefault("reservations", [])
    return pick_reservation_gpus(
        kw.pop("name", "new"),  # type: ignore[arg-type]
        gpus,
        NOW + starts_in,
        NOW + starts_in + lasts,
        now=NOW,
        default_time_limit=24 * HOUR,
        **kw,  # type: ignore[arg-type]
    )


def test_pick_takes_the_busiest_node_that_has_them_free_for_the_window() -> None:
    assert pick(2) == (Placement("n2", (0, 1)),)
    assert pick(4) == (Placement("n1", (0, 1, 2, 3)),)
    assert pick(6) == (Placement("n1", (0, 1, 2, 3)), Placement("n2", (0, 1)))
    # The running job on n2 ends before a window in 4 hours: its GPUs count then.
    assert pick(8, starts_in=4 * HOUR) == (
        Placement("n1", (0, 1, 2, 3)),
        Placement("n2", (0, 1, 2, 3)),
    )
    assert pick(2, nodelist=frozenset({"n1"})) == (Placement("n1", (0, 1)),)


def test_pick_counts_a_job_without_a_limit_as_holding_its_gpus_forever() -> None:
    forever = running("u", "n1", (0, 1, 2, 3), now=NOW, started=30 * 24 * HOUR)
    with pytest.raises(ReservationError, match="job u may still run then"):
        pick(4, starts_in=400 * 24 * HOUR, nodelist=frozenset({"n1"}), running=[forever])
    # --force (Slurm's IGNORE_JOBS): its GPUs are taken; the master stops it at the window.
    forced = pick(
        4, nodelist=frozenset({"n1"}), running=[forever], ignore_jobs=True, starts_in=HOUR
    )
    assert forced == (Placement("n1", (0, 1, 2, 3)),)


def test_pick_refuses_with_one_sentence() -> None:
    other = reservation(name="course-b", gpus=(0, 1, 2, 3), starts_in=0.0, lasts=3 * HOUR)
    with pytest.raises(ReservationError) as err:
        pick(4, nodelist=frozenset({"n1"}), reservations=[other])
    assert str(err.value) == (
        "only 0 of the 4 GPUs asked for are free on n1 for that window "
        "(reservation course-b already holds 4 GPUs there then)"
    )
    # Back to back is not an overlap.
    after = pick(4, starts_in=3 * HOUR, nodelist=frozenset({"n1"}), reservations=[other])
    assert after == (Placement("n1", (0, 1, 2, 3)),)
    cases = {
        "a reservation cannot start in the past": {"starts_in": -60.0},
        "the reservation's window is already over": {"starts_in": -3 * HOUR},
        "a reservation must end after it starts": {"lasts": 0.0},
        "a reservation needs at least 1 GPU": {"gpus": 0},
        "node n9 is not in the cluster": {"nodelist": frozenset({"n9"})},
        "reservation course-b already exists": {"name": "course-b", "reservations": [other]},
    }
    for message, kw in cases.items():
        gpus = kw.pop("gpus", 2)
        with pytest.raises(ReservationError, match=f"^{message}$"):
            pick(gpus, **kw)  # type: ignore[arg-type]
    # Too few because a running job may still hold GPUs then: the sentence names it.
    with pytest.raises(ReservationError) as err:
        pick(7)
    assert str(err.value) == (
        "only 6 of the 7 GPUs asked for are free for that window: job r may still run then "
        "(--force reserves their GPUs anyway and stops them when the window opens)"
    )


def test_could_fit_reservation_checks_the_request_against_its_gpus() -> None:
    res = reservation(gpus=(0, 1))
    assert could_fit_reservation(job("j", gpus=2), res, [node("n1")]) is None
    assert could_fit_reservation(job("j", gpus=3), res, [node("n1")]) == (
        "reservation course-a (2 GPUs) cannot run it: no node has 3 GPUs (the largest has 2); "
        "use --nodes/--gpus-per-node or --distributed to span nodes"
    )


def test_preemption_never_takes_a_reservations_gpus_for_the_head() -> None:
    nodes = [node("n1", ())]
    victims = [
        RunningJob("low", "bob", (Placement("n1", (0, 1, 2, 3)),), NOW - 10, HOUR, preemptible=True)
    ]
    urgent = job("urgent", gpus=2, priority=1000, time_limit=2 * HOUR)
    window = reservation(gpus=(0, 1), starts_in=HOUR)
    d = run(nodes, [urgent], [window], victims, preemption=True)
    assert d.preempt == ["low"]  # GPUs 2, 3 are outside the window: fine
    window = reservation(gpus=(0, 1, 2), starts_in=HOUR)
    d = run(nodes, [urgent], [window], victims, preemption=True)
    assert d.preempt == []  # only GPU 3 would be left to it


def test_jobs_beyond_the_scan_get_reasons_that_depend_on_their_limits() -> None:
    nodes = [node("n1"), node("n2", ())]
    busy = [running("r", "n2", (0, 1, 2, 3), now=NOW, ends_in=HOUR)]
    pending = [
        job("head", gpus=8, priority=100, distributed=True),  # n1 is reserved from +1h: waits
        job("short", gpus=2, submit=1.0, time_limit=HOUR / 2),  # would fit n1 before the window
        job("long", gpus=2, submit=2.0, time_limit=2 * HOUR),  # would still run in it
    ]
    d = run(nodes, pending, [reservation()], busy, backfill_depth=0)
    assert d.starts == []
    assert d.expected_start["head"] == NOW + 3 * HOUR  # after the window
    assert d.reasons["short"] == "priority"
    assert d.reasons["long"] == "waiting for 2 GPUs (reservation course-a takes 4 GPUs in 1h)"
