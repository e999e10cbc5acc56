"""The agent applies a heartbeat interval the master changes after its welcome (the
cluster grew or shrank: master/control/heartbeats.py)."""

from __future__ import annotations

from pathlib import Path

from mgpu.agent.agent import Agent, AgentOptions
from mgpu.protocol import SetHeartbeat, encode, parse_master_messages


def test_the_agent_heartbeats_at_the_interval_the_master_sets(tmp_path: Path) -> None:
    agent = Agent(AgentOptions("n1", "127.0.0.1", 1, tmp_path, fake_gpus=1, insecure=True))
    assert agent.heartbeat_interval == 5.0
    (msg,) = parse_master_messages(encode(SetHeartbeat(heartbeat_interval=20.0)))
    agent._handle(msg)
    assert agent.heartbeat_interval == 20.0
    agent._handle(SetHeartbeat(heartbeat_interval=7.5))
    assert agent.heartbeat_interval == 7.5


def test_an_interval_that_is_not_positive_does_not_parse() -> None:
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        parse_master_messages('{"type": "set_heartbeat", "heartbeat_interval": 0}')
