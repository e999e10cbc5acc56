"""What a submitted job takes from the process that submits it: the directory it runs in
and the variables of its environment that can travel (UTF-8 names and values), with the
names of the others for the warnings the CLI prints."""

from __future__ import annotations

import os

from mgpu.errors import MgpuError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


# What mgpu.execspec.is_env_name accepts (not imported: the CLI must start fast).
_ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*|BASH_FUNC_[A-Za-z_][A-Za-z0-9_.:+-]*%%"


def portable_environment(environ: Any) -> tuple[dict[str, str], list[str]]:
    """The variables of `environ` a job can be given, and the names of the others (shown
    with their non-UTF-8 bytes escaped)."""
    import re

    name_ok = re.compile(_ENV_NAME).fullmatch
    env: dict[str, str] = {}
    skipped: list[str] = []
    for name, value in environ.items():
        if name_ok(name) and _is_utf8(value):
            env[name] = value
        else:
            skipped.append(_shown(name))
    return env, sorted(skipped)


def submit_dir() -> str:
    try:
        cwd = os.getcwd()
    except FileNotFoundError:
        raise MgpuError(
            "the current directory no longer exists; cd to one that does (the job runs there)"
        ) from None
    if not _is_utf8(cwd):
        raise MgpuError(
            f"the current directory {_shown(cwd)} is not valid UTF-8, and the job would run "
            "there; submit from another directory or give cwd"
        )
    return cwd


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(text: str) -> str:
    """Printable on one line: bytes that are not UTF-8 (surrogates) and control
    characters escaped."""
    shown = os.fsencode(text).decode("utf-8", "backslashreplace")
    return shown if shown.isprintable() else shown.encode("unicode_escape").decode("ascii")


def shown_names(names: list[str]) -> str:
    """A list of variable names for one line: long families summed up (SLURM_* (42))."""
    families: dict[str, list[str]] = {}
    for name in names:
        prefix = name.partition("_")[0] + "_" if "_" in name[1:] else name
        families.setdefault(prefix, []).append(name)
    parts: list[str] = []
    for prefix, members in families.items():
        if len(members) > 3:
            parts.append(f"{prefix}* ({len(members)} variables)")
        else:
            parts.extend(members)
    return ", ".join(parts)
