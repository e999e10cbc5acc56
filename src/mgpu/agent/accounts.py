"""Users' ids and homes as the agent starts their jobs, looked up once per burst of jobs.

A lookup by name plus the user's group list reads the user database through NSS
(/etc/passwd and /etc/group here: ~60 µs a job; an LDAP or SSSD lookup costs more).  The
answers are kept for a few seconds, and dropped at once when /etc/passwd or /etc/group
change (a user added, a group membership taken away), so a change takes effect for the
next job as before.  An unknown user is never kept: one created a moment ago is found.
"""

from __future__ import annotations

import os
import pwd
import time
from dataclasses import dataclass

__all__ = ["Account", "home_of", "lookup"]

TTL = 5.0
"""Seconds an answer is used (bounds how long a change NSS does not show in those files
takes to apply)."""
_FILES = ("/etc/passwd", "/etc/group")


@dataclass(frozen=True, slots=True)
class Account:
    uid: int
    gid: int
    groups: list[int]
    home: str


_cache: dict[str, tuple[float, Account]] = {}
_stamp: tuple[float, ...] = ()


def _files_stamp() -> tuple[float, ...]:
    stamp = []
    for path in _FILES:
        try:
            st = os.stat(path)
            stamp += [st.st_mtime, st.st_ino]
        except OSError:
            stamp += [0.0, 0]
    return tuple(stamp)


def _check() -> float:
    """Drop every answer if the files changed; the time now (monotonic)."""
    global _stamp
    stamp = _files_stamp()
    if stamp != _stamp:
        _cache.clear()
        _stamp = stamp
    return time.monotonic()


def lookup(name: str) -> Account:
    """The account `name` (KeyError if there is none)."""
    now = _check()
    hit = _cache.get(name)
    if hit is not None and now - hit[0] < TTL:
        return hit[1]
    pw = pwd.getpwnam(name)
    account = Account(pw.pw_uid, pw.pw_gid, os.getgrouplist(name, pw.pw_gid), pw.pw_dir)
    _cache[name] = (now, account)
    return account


def home_of(uid: int) -> str:
    """The home directory of `uid` (from a cached account when there is one)."""
    now = _check()
    for when, account in _cache.values():
        if account.uid == uid and now - when < TTL:
            return account.home
    return pwd.getpwuid(uid).pw_dir
