"""Where a client finds its token, in order (as the contract says):

--token, $MGPU_TOKEN, ~/.config/mgpu/token, then the admin-token of a master
state dir this user can read ($MGPU_STATE_DIR, else ~/.local/state/mgpu), so the
owner of a one-machine cluster needs no set-up at all.
"""

from __future__ import annotations

import os
from pathlib import Path


def _read(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text or None


def default_state_dir() -> Path:
    env = os.environ.get("MGPU_STATE_DIR")
    return Path(env).expanduser() if env else Path("~/.local/state/mgpu").expanduser()


def find_token(explicit: str | None = None) -> str | None:
    if explicit:
        return explicit.strip()
    env = os.environ.get("MGPU_TOKEN")
    if env:
        return env.strip()
    for path in (
        Path("~/.config/mgpu/token").expanduser(),
        default_state_dir() / "admin-token",
    ):
        token = _read(path)
        if token:
            return token
    return None


def find_join_token(explicit: str | None, state_dir: Path) -> str | None:
    """An agent's join token: --token, $MGPU_JOIN_TOKEN, or a readable master state dir."""
    if explicit:
        return explicit.strip()
    env = os.environ.get("MGPU_JOIN_TOKEN")
    if env:
        return env.strip()
    for path in (state_dir / "join-token", default_state_dir() / "join-token"):
        token = _read(path)
        if token:
            return token
    return None


def is_loopback(host: str) -> bool:
    import ipaddress

    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
