"""Each agent message goes to its type's handler (master/control/agents.py): a type no
agent sends (the parser lets none in; a bug could) is ignored, the node still seen, its
run untouched, the connection kept."""

from __future__ import annotations

import logging

import pytest
from harness import Harness

from mgpu.model import JobState
from mgpu.protocol import Kill, Output, Welcome


@pytest.mark.parametrize(
    "make",
    [
        lambda job_id: Kill(job_id=job_id, epoch=1, reason="stale"),  # names a running job
        lambda job_id: Welcome(heartbeat_interval=5.0),  # names none
    ],
    ids=["with-a-job-id", "without"],
)
def test_a_message_type_no_agent_sends_is_ignored(
    h: Harness, caplog: pytest.LogCaptureFixture, make: object
) -> None:
    agent = h.agent("n1", gpus=1)
    job_id = h.start("sleep 100", agent=agent)
    agent.link.take()
    h.advance(7.0)
    with caplog.at_level(logging.WARNING, logger="mgpu.master"):
        agent.send(make(job_id))  # type: ignore[operator]
    assert h.node("n1").last_seen == h.clock.now  # the node was heard from
    job = h.job(job_id)
    assert job.state == JobState.RUNNING and job.epoch == 1
    assert agent.link.take() == []  # nothing sent back: no kill, no forget
    assert "ignored" in caplog.text
    agent.send(Output(job_id=job_id, epoch=1, stream="o", data="after\n"))
    assert [r["d"] for r in h.cl.outputs.read(job_id)] == ["after\n"]  # still heard
