"""Idempotent submits (master/control/submitkeys.py): a client that lost a submit's answer
sends it again with the same `Idempotency-Key`, and gets the job the first one made."""

from __future__ import annotations

import pytest

from helpers import LocalCluster
from mgpu.client import api
from mgpu.client.api import Client


def _same_key(monkeypatch: pytest.MonkeyPatch, key: bytes) -> None:
    """Every submit of this test carries the same key, as a resent one does."""
    monkeypatch.setattr(api.os, "urandom", lambda n: key[:n])


def test_a_submit_sent_again_with_its_key_makes_one_job(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = cluster.client()
    _same_key(monkeypatch, b"0123456789abcdef")
    first = client.submit("echo once", gpus=0)
    again = client.submit("echo once", gpus=0)
    assert again.id == first.id
    assert client.wait(first.id, timeout=60)["state"] == "completed"
    assert client.submit("echo once", gpus=0).id == first.id  # ended: still that job
    assert [j["id"] for j in client.history()["jobs"]] == [first.id]  # one job, run once

    _same_key(monkeypatch, b"fedcba9876543210")
    array = client.submit("true", gpus=0, array="0-3")
    again = client.submit("true", gpus=0, array="0-3")
    assert (again.id, again.task_ids) == (array.id, array.task_ids)
    assert array.task_ids is not None and len(array.task_ids) == 4

    # Another user's submit with that key is their own: a job of theirs, never the
    # first one's (the key's job is not theirs to see), and not a refusal either.
    other = Client(cluster.address, token=client.create_token("bob")["token"])
    theirs = other.submit("true", gpus=0)
    assert theirs.id not in (first.id, array.id)
    assert other.submit("true", gpus=0).id == theirs.id  # and their key keeps its job

    _same_key(monkeypatch, b"\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10")
    assert client.submit("true", gpus=0).id != first.id  # a new key: a new job
