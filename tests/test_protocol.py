"""Master <-> agent messages: typed parsing, and many messages to a frame."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from mgpu.protocol import (
    Exited,
    Forget,
    Heartbeat,
    Started,
    batch_frames,
    encode,
    parse_agent_messages,
    parse_master_messages,
)


def test_a_single_message_and_a_batch_parse_alike() -> None:
    started = Started(job_id="a1b2c3d4", epoch=1, pid=42, hostname="h", ip="1.2.3.4", time=1.0)
    exited = Exited(job_id="a1b2c3d4", epoch=1, exit_code=3, time=2.0)
    (one,) = parse_agent_messages(encode(started))
    assert one == started
    frames = batch_frames([encode(started), encode(exited), encode(Heartbeat())])
    assert len(frames) == 1 and frames[0].startswith("[")
    assert parse_agent_messages(frames[0]) == [started, exited, Heartbeat()]
    forget = Forget(job_id="a1b2c3d4", epoch=1)
    assert parse_master_messages(batch_frames([encode(forget)] * 2)[0]) == [forget, forget]


def test_batches_respect_the_frame_limit_and_keep_order() -> None:
    items = [encode(Exited(job_id=f"{i:08x}", epoch=1, exit_code=0, time=0.0)) for i in range(50)]
    frames = batch_frames(items, limit=500)
    assert len(frames) > 1
    assert all(len(f) <= 500 + max(map(len, items)) for f in frames)
    flat = [m for f in frames for m in parse_agent_messages(f)]
    assert [m.job_id for m in flat] == [json.loads(i)["job_id"] for i in items]


def test_unknown_or_malformed_messages_are_refused() -> None:
    with pytest.raises(ValidationError):
        parse_agent_messages('{"type": "launch_missiles"}')
    with pytest.raises(ValidationError):
        parse_agent_messages('[{"type": "exited", "job_id": "x"}]')  # fields missing
