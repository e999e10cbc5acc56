"""Users looked up once per burst of jobs: kept a few seconds, dropped when the user
database's files change, an unknown user never kept."""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import Any

import pytest

from mgpu.agent import accounts


@pytest.fixture
def lookups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """NSS stand-ins that count their calls, and stand-ins for /etc/passwd and /etc/group."""
    files = [tmp_path / "passwd", tmp_path / "group"]
    for f in files:
        f.write_text("x\n")
    calls = {"pw": 0, "clock": 1000.0, "files": files}
    users = {"alice": pwd.struct_passwd(("alice", "x", 1001, 1001, "", "/home/alice", "/bin/sh"))}

    def getpwnam(name: str) -> Any:
        calls["pw"] += 1
        return users[name]

    monkeypatch.setattr(accounts.pwd, "getpwnam", getpwnam)
    monkeypatch.setattr(accounts.os, "getgrouplist", lambda name, gid: [gid, 27])
    monkeypatch.setattr(accounts, "_FILES", tuple(str(f) for f in files))
    monkeypatch.setattr(accounts.time, "monotonic", lambda: calls["clock"])
    monkeypatch.setattr(accounts, "_cache", {})
    calls["users"] = users
    return calls


def test_an_account_is_looked_up_once_while_fresh(lookups: dict[str, Any]) -> None:
    first = accounts.lookup("alice")
    assert (first.uid, first.gid, first.groups, first.home) == (
        1001,
        1001,
        [1001, 27],
        "/home/alice",
    )
    assert accounts.lookup("alice") == first and lookups["pw"] == 1
    assert accounts.home_of(1001) == "/home/alice" and lookups["pw"] == 1
    lookups["clock"] += accounts.TTL + 0.1  # stale: asked again
    accounts.lookup("alice")
    assert lookups["pw"] == 2


def test_a_change_of_the_user_database_drops_what_was_kept(lookups: dict[str, Any]) -> None:
    accounts.lookup("alice")
    group = lookups["files"][1]
    group.write_text("x\nwheel:x:10:alice\n")
    os.utime(group, (1, 1))  # a different mtime whatever the clock's resolution
    accounts.lookup("alice")
    assert lookups["pw"] == 2


def test_an_unknown_user_is_never_kept(lookups: dict[str, Any]) -> None:
    for _ in range(2):
        with pytest.raises(KeyError):
            accounts.lookup("bob")
    assert lookups["pw"] == 2
    lookups["users"]["bob"] = pwd.struct_passwd(("bob", "x", 1002, 1002, "", "/b", "/bin/sh"))
    assert accounts.lookup("bob").uid == 1002  # created a moment ago: found at once
