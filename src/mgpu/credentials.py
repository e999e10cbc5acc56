"""Where a client finds its token, in order (as the contract says):

--token, $MGPU_TOKEN, ~/.config/mgpu/token, then the admin-token of a master
state dir this user can read ($MGPU_STATE_DIR, else ~/.local/state/mgpu), so the
owner of a one-machine cluster needs no set-up at all.
"""

from __future__ import annotations

import os

# os.path, not pathlib: pathlib costs the CLI's start-up ~2 ms.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except (OSError, ValueError):  # ValueError: not text
        return None
    return text or None


def default_state_dir() -> str:
    return os.path.expanduser(os.environ.get("MGPU_STATE_DIR") or "~/.local/state/mgpu")


def find_token(explicit: str | None = None) -> str | None:
    if explicit:
        return explicit.strip()
    env = os.environ.get("MGPU_TOKEN")
    if env:
        return env.strip()
    for path in (
        os.path.expanduser("~/.config/mgpu/token"),
        os.path.join(default_state_dir(), "admin-token"),
    ):
        token = _read(path)
        if token:
            return token
    return None


def find_join_token(explicit: str | None, state_dir: Path | str) -> str | None:
    """An agent's join token: --token, $MGPU_JOIN_TOKEN, or a readable master state dir."""
    if explicit:
        return explicit.strip()
    env = os.environ.get("MGPU_JOIN_TOKEN")
    if env:
        return env.strip()
    for path in (
        os.path.join(state_dir, "join-token"),
        os.path.join(default_state_dir(), "join-token"),
    ):
        token = _read(path)
        if token:
            return token
    return None


def is_loopback(host: str) -> bool:
    if host in ("localhost", "", "127.0.0.1", "::1"):
        return True  # the usual ones, without importing ipaddress (the CLI's start-up)
    import ipaddress

    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
