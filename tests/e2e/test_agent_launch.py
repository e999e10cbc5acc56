"""A launch the job itself makes impossible fails the job, never the node or the connection;
failed launches and `--mpi` hostfiles leave nothing behind."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import stat
from pathlib import Path
from typing import Any

import pytest

from helpers import LocalCluster, local_cluster
from mgpu import Client
from mgpu.agent.launcher import JobError, Launcher, LaunchRequest
from mgpu.protocol import Welcome, encode
from standinmaster import agent_served_until

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs a root agent")


def launch(job_id: str, **kw: Any) -> dict[str, Any]:
    # No user: run as the agent's own, which a root agent does only with the owner's grant.
    msg = {"type": "launch", "job_id": job_id, "epoch": 1, "grant": {"gpus": [0]}}
    msg |= {"allow_root": True}
    msg |= {"argv": ["/bin/sh", "-c", "echo ran"], "env": {"PATH": "/usr/bin:/bin"}}
    return msg | kw


# ---- through a real connection to a stand-in master -------------------------------------


async def _fake_master(tmp_path: Path) -> dict[str, Any]:
    """Serve one agent: send it a frame mixing good and impossible launches, then another
    frame; collect what it answers."""

    seen: dict[str, Any] = {"connections": 0, "started": set(), "exited": {}}
    done = asyncio.Event()
    good = {"good1", "good2", "good3"}
    bad = {"huge", "nul_env", "eq_name", "nul_argv", "surrogate", "unreadable"}

    async def serve(ws: Any) -> None:
        seen["connections"] += 1
        json.loads(await ws.recv())  # hello
        await ws.send(encode(Welcome(heartbeat_interval=0.2)))
        frame = [
            launch("good1"),
            launch("huge", argv=["/bin/echo", "x" * 1_000_000]),
            launch("nul_env", env={"V": "a\0b"}),
            launch("eq_name", env={"A=B": "1"}),
            launch("nul_argv", argv=["/bin/echo", "a\0b"]),
            launch("surrogate", env={"V": "\ud800"}),
            launch("unreadable", grant={"gpus": "all"}),  # does not even validate
            launch("good2"),
        ]
        await ws.send(json.dumps(frame))
        sent_third = False
        async for raw in ws:
            items = json.loads(raw)
            for msg in items if isinstance(items, list) else [items]:
                if msg["type"] == "started":
                    seen["started"].add(msg["job_id"])
                elif msg["type"] == "exited":
                    seen["exited"][msg["job_id"]] = msg
            if not sent_third and bad | {"good1", "good2"} <= set(seen["exited"]):
                sent_third = True  # the same connection still takes new work
                await ws.send(json.dumps(launch("good3")))
            if good <= set(seen["exited"]) and bad <= set(seen["exited"]):
                done.set()
                return

    agent = await agent_served_until(serve, done, tmp_path)
    for run in agent.launcher.running.values():  # all ended; nothing to stop
        assert run.exited.is_set()
    seen["spool"] = sorted(p.name for p in agent.launcher.spool.iterdir())
    return seen


def test_impossible_launches_fail_their_jobs_not_the_node_or_the_connection(
    tmp_path: Path,
) -> None:
    seen = asyncio.run(_fake_master(tmp_path))
    assert seen["connections"] == 1  # never dropped
    exited = seen["exited"]
    for job in ("good1", "good2", "good3"):
        assert job in seen["started"] and exited[job]["exit_code"] == 0, exited[job]
    for job in ("huge", "nul_env", "eq_name", "nul_argv", "surrogate", "unreadable"):
        # fatal: the master fails the job and does not count it against the node.
        assert exited[job]["fatal"] is True and exited[job]["launch_error"], exited[job]
        assert job not in seen["started"]
    assert "too big" in exited["huge"]["launch_error"]
    assert "null" in exited["nul_env"]["launch_error"]
    assert "cannot read the launch" in exited["unreadable"]["launch_error"]
    # No spool files of the failed launches (the good ones' stay until the master's Forget).
    assert not [name for name in seen["spool"] if not name.startswith("good")], seen["spool"]


def test_a_short_jobs_start_goes_with_its_end_and_a_long_jobs_start_goes_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's start is held (STARTED_HOLD) so that a short job's start and end reach the
    master in one frame; a job still running when the hold is over is reported started
    then, before it ends, with the time it really started."""

    from mgpu.agent import agent as agent_module

    monkeypatch.setattr(agent_module, "STARTED_HOLD", 0.5)  # ample on a loaded machine
    frames: list[list[dict[str, Any]]] = []

    async def scenario() -> None:
        done = asyncio.Event()

        async def serve(ws: Any) -> None:
            json.loads(await ws.recv())  # hello
            await ws.send(encode(Welcome(heartbeat_interval=30)))
            quick = launch("quick", argv=["/bin/sh", "-c", "exit 3"])
            slow = launch("slow", argv=["/bin/sh", "-c", "sleep 1.5"])
            await ws.send(json.dumps([quick, slow]))
            async for raw in ws:
                items = json.loads(raw)
                items = items if isinstance(items, list) else [items]
                frames.append([m for m in items if m["type"] in ("started", "exited")])
                ended = {m["job_id"] for f in frames for m in f if m["type"] == "exited"}
                if ended == {"quick", "slow"}:
                    done.set()
                    return

        await agent_served_until(serve, done, tmp_path)

    asyncio.run(scenario())
    told = [(m["type"], m["job_id"]) for f in frames for m in f]
    where = {(m["type"], m["job_id"]): i for i, f in enumerate(frames) for m in f}
    assert told.count(("started", "quick")) == 1 and told.count(("started", "slow")) == 1
    assert where[("started", "quick")] == where[("exited", "quick")]  # one frame
    assert told.index(("started", "quick")) < told.index(("exited", "quick"))
    assert where[("started", "slow")] < where[("exited", "slow")]  # told while it ran
    started, ended = (
        next(m for f in frames for m in f if (m["type"], m["job_id"]) == key)
        for key in (("started", "slow"), ("exited", "slow"))
    )
    assert ended["time"] - started["time"] > 1.0  # the real start time, not when told


# ---- the launcher alone ---------------------------------------------------------------


def _launcher(tmp_path: Path) -> Launcher:
    return Launcher(tmp_path / "spool", lambda *a: None)


def test_failed_launch_leaves_no_spool_files(tmp_path: Path) -> None:
    async def scenario() -> None:
        launcher = _launcher(tmp_path)
        with pytest.raises(JobError, match="too big"):
            launcher.launch(LaunchRequest("j1", 1, ["/bin/echo", "x" * 200_000], {}))
        with pytest.raises(JobError, match="null"):
            launcher.launch(LaunchRequest("j2", 1, ["/bin/echo"], {"V": "\0"}, hostfile="h\n"))
        assert list(launcher.spool.iterdir()) == []

    asyncio.run(scenario())


@ROOT_ONLY
def test_mpi_hostfile_of_another_user_is_private_and_removed(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    ids = (nobody.pw_uid, nobody.pw_gid, [nobody.pw_gid])

    async def scenario() -> tuple[str, os.stat_result, str]:
        launcher = _launcher(tmp_path)
        sweeper = asyncio.create_task(launcher.sweep(interval=0.05))
        argv = ["/bin/sh", "-c", 'cat "$MGPU_HOSTFILE"; echo "$MGPU_HOSTFILE"']
        run = launcher.launch(
            LaunchRequest("j1", 1, argv, {}, user_ids=ids, hostfile="node1 slots=2\n")
        )
        info = os.stat(run.rec.hosts)
        await asyncio.wait_for(run.exited.wait(), 20)
        await launcher.kill_leftovers(run)
        assert launcher.exit_code(run) == 0
        seen = Path(run.rec.out_path).read_text()
        launcher.finish(run)
        for _ in range(200):
            if not os.path.exists(run.rec.hosts):
                break
            await asyncio.sleep(0.05)
        sweeper.cancel()
        return run.rec.hosts, info, seen

    hosts, info, seen = asyncio.run(scenario())
    assert seen == f"node1 slots=2\n{hosts}\n"  # the job (as nobody) could read it
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (pwd.getpwnam("nobody").pw_uid, 0o600)
    assert os.path.basename(hosts).startswith("mgpu-") and hosts.endswith(".hosts")
    assert not os.path.exists(hosts)  # removed with the run's spool files


@ROOT_ONLY
def test_spool_files_are_used_again_only_by_runs_of_the_same_user(tmp_path: Path) -> None:
    """A finished run's stdout, stderr and exit files go to a pool of its user's and the
    next run of that user gets them (emptied); another user's run never does."""
    nobody = pwd.getpwnam("nobody")
    me = (os.geteuid(), os.getegid(), os.getgroups())
    them = (nobody.pw_uid, nobody.pw_gid, [nobody.pw_gid])

    async def run_one(launcher: Launcher, job: str, ids: Any) -> tuple[set[int], str]:
        argv = ["/bin/sh", "-c", f"echo {job}"]
        run = launcher.launch(LaunchRequest(job, 1, argv, {}, "/", user_ids=ids))
        paths = (run.rec.out_path, run.rec.err_path, run.rec.exit_path)
        inodes = {os.stat(p).st_ino for p in paths}
        await asyncio.wait_for(run.exited.wait(), 20)
        await launcher.kill_leftovers(run)
        assert launcher.exit_code(run) == 0
        out = Path(run.rec.out_path).read_text()
        launcher.finish(run)
        return inodes, out

    async def pooled(launcher: Launcher, key: str, count: int) -> list[str]:
        while launcher._trash or len(launcher.pool.free.get(key, [])) < count:
            await asyncio.sleep(0.02)
        return launcher.pool.free[key]

    async def scenario() -> None:
        launcher = _launcher(tmp_path)
        sweeper = asyncio.create_task(launcher.sweep(interval=0.02))
        first, _ = await run_one(launcher, "j1", me)
        await asyncio.wait_for(pooled(launcher, str(me[0]), 2), 10)
        other, _ = await run_one(launcher, "j2", them)
        assert not first & other
        again, out = await run_one(launcher, "j3", me)
        assert again == first and out == "j3\n"  # the same files, only the new run's output
        # The exit file a job of `nobody` could write to stays theirs, in their own pool.
        exits = await asyncio.wait_for(pooled(launcher, f"{them[0]}x", 1), 10)
        assert [os.stat(p).st_uid for p in exits] == [them[0]]
        sweeper.cancel()

    asyncio.run(scenario())


def test_a_restarted_agent_reads_exit_codes_from_reused_files_and_keeps_running_ones(
    tmp_path: Path,
) -> None:
    """Exit files are used again without being emptied: a shorter code written over a
    longer one still reads right.  A new agent process reads the code from the file (it
    is not the shim's parent), and does not hand out the files of runs still going."""
    me = (os.geteuid(), os.getegid(), os.getgroups())

    async def ended(launcher: Launcher, job: str, argv: list[str]) -> Any:
        run = launcher.launch(LaunchRequest(job, 1, argv, {}, "/", user_ids=me))
        await asyncio.wait_for(run.exited.wait(), 20)
        await launcher.kill_leftovers(run)
        return run

    async def scenario() -> None:
        launcher = _launcher(tmp_path)
        first = await ended(launcher, "j1", ["/bin/sh", "-c", "exit 123"])
        assert launcher.exit_code(first) == 123
        launcher.finish(first)
        sweeper = asyncio.create_task(launcher.sweep(interval=0.02))
        while launcher._trash or not launcher.pool.free.get(f"{me[0]}x"):
            await asyncio.sleep(0.02)
        second = await ended(launcher, "j2", ["/bin/sh", "-c", "exit 4"])
        assert second.rec.exit_path == first.rec.exit_path  # the same file, not emptied
        assert Path(second.rec.exit_path).read_bytes().startswith(b"4\n")
        going = launcher.launch(LaunchRequest("j3", 1, ["sleep", "30"], {}, "/", user_ids=me))
        sweeper.cancel()
        # A new agent process: the shims are not its children.
        later = _launcher(tmp_path)
        records = {rec.job_id: rec for rec in later.load_previous()}
        assert set(records) == {"j2", "j3"}
        assert later.exit_code(later.adopt(records["j2"])) == 4
        adopted = later.adopt(records["j3"])
        assert not adopted.exited.is_set()
        free = {p for paths in later.pool.free.values() for p in paths}
        assert not free & {going.rec.out_path, going.rec.err_path, going.rec.exit_path}
        os.killpg(going.rec.pid, 9)
        await asyncio.wait_for(adopted.exited.wait(), 20)
        going.popen.wait()  # type: ignore[union-attr]

    asyncio.run(scenario())


@ROOT_ONLY
def test_other_users_runs_start_through_the_spawner_with_their_ids_and_cgroup(
    tmp_path: Path,
) -> None:
    """A root agent starts other users' shims through its spawner (no fork of itself):
    they run as their user with their groups, in their run's cgroup; a spawner that died
    is started again, and a run it had started still ends with its own exit code."""
    nobody = pwd.getpwnam("nobody")
    ids = (nobody.pw_uid, nobody.pw_gid, [nobody.pw_gid, 100])
    script = "id -u; id -G; cat /proc/self/cgroup; exit 5"

    async def one(launcher: Launcher, job: str, argv: list[str]) -> Any:
        return launcher.launch(LaunchRequest(job, 1, argv, {}, "/", user_ids=ids))

    async def scenario() -> None:
        launcher = _launcher(tmp_path)
        containment = launcher.contain("spawn1", [])
        run = await one(launcher, "j1", ["/bin/sh", "-c", script])
        assert type(run.popen).__name__ == "Spawned"
        await asyncio.wait_for(run.exited.wait(), 20)
        await launcher.kill_leftovers(run)
        assert launcher.exit_code(run) == 5
        uid, groups, *cgroup_lines = Path(run.rec.out_path).read_text().splitlines()
        assert int(uid) == nobody.pw_uid
        assert sorted(map(int, groups.split())) == sorted({nobody.pw_gid, 100})
        if containment.method != "process-tree":
            assert any(line.endswith(run.rec.cgroup.split("/")[-1]) for line in cgroup_lines)
        # A run going on while its spawner dies.
        spawner = launcher.spawner
        assert spawner is not None and spawner._proc is not None
        long = await one(launcher, "j2", ["/bin/sh", "-c", "sleep 0.5; exit 4"])
        os.kill(spawner._proc.pid, 9)
        await asyncio.wait_for(long.exited.wait(), 20)
        await launcher.kill_leftovers(long)
        assert launcher.exit_code(long) == 4  # from its exit file
        again = await one(launcher, "j3", ["/bin/sh", "-c", "id -u"])
        await asyncio.wait_for(again.exited.wait(), 20)
        await launcher.kill_leftovers(again)
        assert launcher.exit_code(again) == 0
        assert Path(again.rec.out_path).read_text() == f"{nobody.pw_uid}\n"
        spawner.stop()

    asyncio.run(scenario())


# ---- a real cluster -----------------------------------------------------------------------


@ROOT_ONLY
def test_working_dir_the_user_cannot_enter_fails_the_job_not_the_node(tmp_path: Path) -> None:
    """The job's user enters its directory itself: a root agent's chdir would start it
    inside a directory whose parents its user may not pass (here: readable `sub` under a
    0700 `private`)."""
    sub = tmp_path / "private" / "sub"
    sub.mkdir(parents=True)
    (tmp_path / "private").chmod(0o700)
    sub.chmod(0o755)
    with local_cluster(tmp_path, agents=1, gpus=1) as c:
        admin = c.client()
        nobody = Client(c.address, token=admin.create_token("nobody")["token"], connect_timeout=2)
        jobs = [nobody.submit("pwd; ls", gpus=1, cwd=str(sub)) for _ in range(3)]
        for job in jobs:
            done = admin.wait(job.id, timeout=30)
            assert (done["state"], done["exit_code"], done["retries"]) == ("failed", 126, 0)
            assert admin.logs(job.id) == f"mgpu: cannot enter the working directory {sub}\n"
        node = _node(c)
        assert (node["state"], node["failures"]) == ("online", 0)
        fine = nobody.submit("pwd", gpus=1, cwd="/")
        assert admin.wait(fine.id, timeout=30)["state"] == "completed"
        assert admin.logs(fine.id) == "/\n"
        mine = admin.submit("pwd", gpus=1, cwd=str(sub))  # root may
        assert admin.wait(mine.id, timeout=30)["state"] == "completed"
        assert admin.logs(mine.id) == f"{sub}\n"


def _node(c: LocalCluster) -> dict[str, Any]:
    (node,) = c.client().nodes()
    return node
