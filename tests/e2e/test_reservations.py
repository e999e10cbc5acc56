"""`mgpu reserve` and `--reservation` end to end through the CLI: create, list, delete; the
window kept for its members (others kept off if they would still run when it opens); restart
survival; the one-sentence refusals.  Also the estimates: `queue` shows a start for every
queued job of a small known queue and `show` explains what it waits for."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from helpers import LocalCluster, kill_group, local_cluster, wait_for
from mgpu.client.api import RequestError


def reservations(c: LocalCluster) -> list[dict]:  # type: ignore[type-arg]
    out = json.loads(c.cli("reserve", "list", "--json", check=True).stdout)
    found: list[dict] = out["reservations"]  # type: ignore[type-arg]
    return found


def one_line_error(res: object, *words: str) -> None:
    assert res.returncode != 0  # type: ignore[attr-defined]
    err: str = res.stderr  # type: ignore[attr-defined]
    assert err.startswith("mgpu: error: ") and err.count("\n") == 1, err
    for w in words:
        assert w in err, err


def test_create_list_delete_and_restart(cluster: LocalCluster) -> None:
    c = cluster
    me = c.client().whoami()["user"]
    made = c.cli(
        "reserve", "create", "course-a", "--gpus", "2", "--nodelist", "node002",
        "--start", "now+60", "--duration", "2:00:00", "--users", me, check=True,
    ).stdout  # fmt: skip
    assert made.startswith("reservation course-a: node002:")
    (r,) = reservations(c)
    assert r["name"] == "course-a" and r["gpus"] == 2 and r["users"] == [me]
    assert r["state"] == "waiting" and r["end"] - r["start"] == 7200
    assert r["allocation"][0]["node_id"] == "node002" and len(r["allocation"][0]["gpu_ids"]) == 2
    assert "course-a" in c.cli("reserve", "list", check=True).stdout

    assert c.master is not None
    kill_group(c.master)
    c.start_master()
    assert reservations(c) == [r]  # kept in SQLite

    assert c.cli("reserve", "delete", "course-a", check=True).stdout.strip() == (
        "reservation course-a deleted"
    )
    assert reservations(c) == []
    one_line_error(c.cli("reserve", "delete", "course-a"), "no such reservation: course-a")
    kinds = [e["kind"] for e in c.client().audit()]
    assert "reservation_create" in kinds and "reservation_delete" in kinds


def test_bad_reservations_are_refused_and_nothing_stored(cluster: LocalCluster) -> None:
    c = cluster
    c.cli("reserve", "create", "a", "--gpus", "4", "--nodelist", "node001",
          "--start", "now+60", "--duration", "60", check=True)  # fmt: skip
    bad = {
        "past": (["--start", "2020-01-01T00:00", "--duration", "60"], "over"),
        "backwards": (["--start", "now+60", "--end", "now+30"], "must end after it starts"),
        "overlap": (
            ["--nodelist", "node001", "--start", "now+90", "--duration", "60"],
            "reservation a already holds 4 GPUs there then",
        ),
        "user": (["--duration", "60", "--users", "nosuchuser-xyz"], "unknown user"),
        "node": (["--nodelist", "node999", "--duration", "60"], "node node999 is not in"),
        "length": (["--start", "now"], "one of the arguments --duration --end is required"),
        "when": (["--start", "tomorrow", "--duration", "60"], "is not a time"),
        "far": (["--end", "now+99999999999"], "--end must be a time within 10 years of now"),
        "long": (["--duration", "99999-0"], "--duration must end within 10 years of now"),
    }
    for name, (args, words) in bad.items():
        one_line_error(c.cli("reserve", "create", name, "--gpus", "1", *args), words)
    with pytest.raises(RequestError, match="--end must be a time within 10 years of now"):
        c.client().reserve("absurd", 1, start="now", end=1e300)  # the API, past the CLI
    token = json.loads(c.cli("token", "create", "bob", "--json", check=True).stdout)["token"]
    as_bob = c.cli("--token", token, "reserve", "create", "b", "--gpus", "1", "--duration", "5")
    one_line_error(as_bob, "not authorised", "admin")
    assert [r["name"] for r in reservations(c)] == ["a"]
    # Submitting into it: only its users (anyone here), only reservations that exist.
    one_line_error(c.cli("submit", "--reservation", "nope", "true"), "no such reservation")
    c.cli("reserve", "create", "mine", "--gpus", "1", "--nodelist", "node002",
          "--duration", "60", "--users", c.client().whoami()["user"], check=True)  # fmt: skip
    as_bob = c.cli("--token", token, "submit", "--reservation", "mine", "true")
    one_line_error(as_bob, "user bob is not one of its users")
    one_line_error(
        c.cli("submit", "--reservation", "mine", "--gpus", "2", "true"), "reservation mine"
    )
    assert c.client().queue(all=True)["jobs"] == []


def test_window_kept_for_its_members(tmp_path: Path) -> None:
    with local_cluster(tmp_path, agents=1, gpus=2) as c:
        client = c.client()
        me = client.whoami()["user"]
        c.cli("reserve", "create", "course", "--gpus", "1", "--start", "now+0.05",
              "--duration", "10", "--users", me, check=True)  # fmt: skip
        (r,) = reservations(c)
        reserved = r["allocation"][0]["gpu_ids"]
        # Would still run when the window opens: only the GPU outside it.
        narrow = c.cli("submit", "--gpus", "1", "--time", "60", "sleep 300", check=True)
        narrow_id = narrow.stdout.strip()
        wait_for(lambda: client.show(narrow_id)["state"] == "running", what="narrow job")
        assert client.show(narrow_id)["allocation"][0]["gpu_ids"] != reserved
        # Needs the reserved GPU too: kept off it, its reason names the reservation.
        wide = c.cli("submit", "--gpus", "1", "--time", "60", "sleep 300", check=True)
        wide_id = wide.stdout.strip()
        member = c.cli("submit", "--reservation", "course", "--time", "5", "echo in", check=True)
        member_id = member.stdout.strip()
        wait_for(
            lambda: "reservation course" in (client.show(wide_id)["reason"] or ""),
            what="the kept-out job's reason naming the reservation",
        )
        before = client.show(member_id)
        if before["state"] == "queued":
            assert "waiting for reservation course" in before["reason"]
        done = client.wait(member_id, timeout=60)
        assert done["state"] == "completed"
        assert done["allocation"][0]["gpu_ids"] == reserved
        assert done["start_time"] >= r["start"]
        assert client.show(wide_id)["state"] == "queued"
        # While the member ran no GPU was free ("waiting for 1 GPU"); the pass after its exit
        # names the reservation again.  Reasons are rewritten by the pass, so await it.
        wait_for(
            lambda: "reservation course holds 1 GPU" in (client.show(wide_id)["reason"] or ""),
            what="the kept-out job's reason naming the reservation after the member ended",
        )
        assert client.show(wide_id)["state"] == "queued"
        c.cli("cancel", wide_id, narrow_id, check=True)


def test_queue_and_show_give_every_queued_job_an_estimate(tmp_path: Path) -> None:
    with local_cluster(tmp_path, agents=1, gpus=2) as c:
        client = c.client()
        first = c.cli("submit", "--gpus", "2", "--time", "10", "sleep 600", check=True)
        first_id = first.stdout.strip()
        started = wait_for(lambda: client.show(first_id)["start_time"], what="first job")
        second = c.cli("submit", "--gpus", "2", "--time", "5", "true", check=True).stdout.strip()
        third = c.cli("submit", "--gpus", "1", "--time", "5", "true", check=True).stdout.strip()
        wait_for(
            lambda: client.show(third).get("expected_start") is not None,
            what="the estimates",
        )
        jobs = {j["id"]: j for j in client.queue()["jobs"]}
        assert jobs[second]["expected_start"] == pytest.approx(started + 600, abs=2)
        assert jobs[third]["expected_start"] == pytest.approx(started + 900, abs=2)
        assert jobs[second]["waiting_on"] == [first_id]
        assert jobs[third]["waiting_on"][-1] == second
        table = c.cli("queue", check=True).stdout
        header = table.splitlines()[1]
        assert "START" in header
        line = {j: next(x for x in table.splitlines() if x.startswith(j)) for j in (second, third)}
        elapsed = time.time() - started
        assert f"in {round((600 - elapsed) / 60)}m" in line[second]
        assert f"in {round((900 - elapsed) / 60)}m" in line[third]
        shown = c.cli("show", second, check=True).stdout
        until = time.strftime("%H:%M", time.localtime(started + 600))
        assert f"waits for:  2 GPUs held by job {first_id} until ~{until}" in shown
        c.cli("cancel", first_id, second, third, check=True)


def test_unlimited_jobs_keep_off_reserved_gpus_and_an_intruder_is_stopped(tmp_path: Path) -> None:
    with local_cluster(tmp_path, agents=1, gpus=2) as c:
        client = c.client()
        me = client.whoami()["user"]
        c.cli("reserve", "create", "course", "--gpus", "1", "--start", "now+0.5",
              "--duration", "10", "--users", me, check=True)  # fmt: skip
        (course,) = reservations(c)
        # No --time: nothing ends it, so it may not go on GPUs reserved even 30 s later.
        first = c.cli("submit", "--gpus", "1", "sleep 300", check=True).stdout.strip()
        wait_for(lambda: client.show(first)["state"] == "running", what="the unlimited job")
        assert client.show(first)["allocation"][0]["gpu_ids"] != course["allocation"][0]["gpu_ids"]
        second = c.cli("submit", "--gpus", "1", "--time", "UNLIMITED", "sleep 300", check=True)
        second_id = second.stdout.strip()
        wait_for(
            lambda: "reservation course" in (client.show(second_id)["reason"] or ""),
            what="the second unlimited job kept off the reserved GPU",
        )
        assert client.show(second_id)["state"] == "queued"
        # A reservation on the GPU the unlimited job holds: refused, naming it...
        late = ["reserve", "create", "late", "--gpus", "1", "--start", "now+0.1",
                "--duration", "1"]  # fmt: skip
        one_line_error(c.cli(*late), f"job {first} may still run then", "--force")
        # ...unless forced: when its window opens the job is preempted, no retry spent.
        c.cli(*late, "--force", check=True)
        wait_for(
            lambda: client.show(first)["attempts"][0].get("end_reason"),
            timeout=30,
            what="the job on the forced reservation's GPU stopped when its window opened",
        )
        shown = client.show(first)
        assert shown["attempts"][0]["end_reason"] == (
            "preempted by reservation late, whose window opened on its GPUs"
        )
        assert shown["state"] == "queued" and shown["retries"] == 0
        c.cli("cancel", first, second_id, check=True)
