"""A run's output is read from its spool files a bounded piece at a time, and not at all
while the queue to the master is full; all of it still goes, in order."""

from __future__ import annotations

from pathlib import Path

from mgpu.agent.launcher import READ_MAX, Launcher, Running, RunRecord

Sent = list[tuple[str, str, int, int]]


def setup(tmp_path: Path, out: bytes, err: bytes) -> tuple[Launcher, Running, Sent]:
    sent: Sent = []
    launcher = Launcher(
        tmp_path / "spool", lambda job, epoch, s, text, a, b: sent.append((s, text, a, b))
    )
    (tmp_path / "o").write_bytes(out)
    (tmp_path / "e").write_bytes(err)
    rec = RunRecord(
        job_id="j1",
        epoch=1,
        pid=1,
        create_time=0.0,
        start_time=0.0,
        out_path=str(tmp_path / "o"),
        err_path=str(tmp_path / "e"),
        exit_path=str(tmp_path / "x"),
    )
    return launcher, Running(rec=rec), sent


def joined(sent: Sent, stream: str) -> str:
    """The stream's text, checking that each piece starts where the one before ended."""
    at, parts = 0, []
    for s, text, start, end in sent:
        if s == stream:
            assert start == at, (stream, start, at)
            parts.append(text)
            at = end
    return "".join(parts)


def test_each_look_reads_at_most_read_max_of_a_stream_and_all_arrives_in_order(
    tmp_path: Path,
) -> None:
    out = ("é" * 3_000_001 + "end\n").encode()  # two-byte characters across every chunk edge
    err = b"warning\n" * 1000
    launcher, run, sent = setup(tmp_path, out, err)
    looks = 0
    while not launcher.pump_output(run):
        looks += 1
        assert run.rec.out_sent <= looks * READ_MAX
        assert looks < 10
    assert looks == len(out) // READ_MAX  # 6 MB: one look stopped at READ_MAX, one caught up
    assert joined(sent, "o") == out.decode() and joined(sent, "e") == err.decode()
    assert (run.rec.out_sent, run.rec.err_sent) == (len(out), len(err))
    assert launcher.pump_output(run)  # nothing new: caught up


def test_nothing_is_read_while_the_queue_is_full(tmp_path: Path) -> None:
    launcher, run, sent = setup(tmp_path, b"x" * 1000, b"y" * 10)
    room = [False]
    launcher.output_room = lambda: room[0]
    assert not launcher.pump_output(run)
    assert sent == [] and (run.rec.out_sent, run.rec.err_sent) == (0, 0)
    room[0] = True
    assert launcher.pump_output(run)
    assert joined(sent, "o") == "x" * 1000 and joined(sent, "e") == "y" * 10


def test_an_ended_runs_output_is_sent_up_to_a_file_cut_short_meanwhile(tmp_path: Path) -> None:
    """A process that escaped the job (setsid, no cgroup) still holds its stdout and may
    truncate it after the run ended: the agent sends what is there and goes on to report
    the end, rather than waiting on the loop for bytes that will never come."""
    import asyncio

    from mgpu.agent.agent import Agent, AgentOptions

    async def scenario() -> bool:
        agent = Agent(AgentOptions("n1", "127.0.0.1", 1, tmp_path, fake_gpus=1, insecure=True))
        _, run, _ = setup(tmp_path, b"x" * (READ_MAX + READ_MAX // 2), b"")
        agent.connected = True
        task = asyncio.get_running_loop().create_task(agent._send_all_output(run))
        await asyncio.sleep(0)  # its first look: READ_MAX read, the rest on its next turn
        assert run.rec.out_sent == READ_MAX
        with open(run.rec.out_path, "r+b") as f:
            f.truncate(1000)
        return await asyncio.wait_for(task, 10)

    assert asyncio.run(scenario())
