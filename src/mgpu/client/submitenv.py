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


def step_environment(environ: Any, export: str | None) -> dict[str, str]:
    """What an srun step's tasks get of `environ`, srun's `--export` as Slurm 22.05 reads
    it (launch_slurm.c `_build_user_env`): unset, all of it; else the list's `NAME=value`
    and `NAME` (this value, if set), up to a `NONE`; then every variable with `ALL` in the
    list (over those), else only the `SLURM*` ones.  (`NIL`, like any name not set, adds
    nothing.)"""
    if export is None:
        return dict(environ)
    out: dict[str, str] = {}
    everything = False
    for token in _quote_tokens(export):
        if token.upper() == "ALL":
            everything = True
        if token.upper() == "NONE":
            break
        name, eq, value = token.partition("=")
        if eq:
            out[name] = value
        elif token in environ:
            out[token] = environ[token]
    for name, value in environ.items():
        if everything or name.startswith("SLURM"):
            out[name] = value
    return out


def _quote_tokens(text: str) -> list[str]:
    """Slurm's `find_quote_token` over ",": commas inside quotes do not split, and a token
    quoted whole loses its quotes."""
    tokens: list[str] = []
    current, quote = "", ""
    for char in text + ",":
        if char in "'\"" and (not quote or quote == char):
            quote = "" if quote else char
        if char == "," and not quote:
            if len(current) >= 2 and current[0] == current[-1] and current[0] in "'\"":
                current = current[1:-1]
            if current:
                tokens.append(current)
            current = ""
        else:
            current += char
    return tokens


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
