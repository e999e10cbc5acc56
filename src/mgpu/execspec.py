"""What a program can be given: argv, environment, working directory, container image.

Every string must be valid UTF-8 without NUL (`mgpu.spec.validate_text`), and sizes are
capped well below the kernel's limits (128 KiB per string, about 2 MiB for argv and the
environment together), so a job that is accepted never fails to start because of what it
asked for: argv and environment stay under 512 KiB together, a quarter of `execve`'s room.

Environment names are POSIX names (``[A-Za-z_][A-Za-z0-9_]*``), plus the form bash uses to
export a function (``BASH_FUNC_module%%``, which Lmod and environment modules rely on when
``/bin/sh`` is bash).  Names the scheduler sets itself (`RESERVED_ENV_NAMES`,
`RESERVED_ENV_PREFIXES`) are valid but are not passed to the job (`is_reserved_env_name`).
Errors are `SpecError`s that name the option (``--argv[2]``, ``--env[NAME]``, ``--cwd``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Final

from mgpu.spec import MAX_COMMAND_BYTES, SpecError, _q, text_problem, validate_text

__all__ = [
    "MAX_ARGV_BYTES",
    "MAX_ARGV_ITEMS",
    "MAX_ARG_BYTES",
    "MAX_ENV_BYTES",
    "MAX_ENV_ENTRY_BYTES",
    "MAX_ENV_VARS",
    "MAX_PATH_BYTES",
    "RENDEZVOUS_ENV_NAMES",
    "RESERVED_ENV_NAMES",
    "RESERVED_ENV_PREFIXES",
    "is_env_name",
    "is_rendezvous_env_name",
    "is_reserved_env_name",
    "validate_argv",
    "validate_cwd",
    "validate_env",
    "validate_image",
]

MAX_ARGV_ITEMS: Final = 4096
MAX_ARG_BYTES: Final = MAX_COMMAND_BYTES
"""Largest argv element (the kernel refuses one over 128 KiB)."""
MAX_ARGV_BYTES: Final = 256 * 1024
MAX_ENV_VARS: Final = 4096
MAX_ENV_ENTRY_BYTES: Final = 64 * 1024
"""Largest ``NAME=value`` (the kernel refuses one over 128 KiB)."""
MAX_ENV_BYTES: Final = 256 * 1024
MAX_PATH_BYTES: Final = 4095


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validate_argv(argv: Sequence[str], option: str = "--argv") -> list[str]:
    """A command given as argv: 1..4096 arguments of UTF-8 without NUL, each at most
    64 KiB and 256 KiB in all, the first not blank."""
    if not argv:
        raise SpecError("the command is empty; give the program to run and its arguments")
    if len(argv) > MAX_ARGV_ITEMS:
        raise SpecError(
            f"{option} has {len(argv)} arguments; at most {MAX_ARGV_ITEMS} are allowed, "
            "so pass long lists in a file"
        )
    total = 0
    for i, arg in enumerate(argv):
        validate_text(arg, f"{option}[{i}]")
        size = len(arg.encode("utf-8"))
        if size > MAX_ARG_BYTES:
            raise SpecError(
                f"{option}[{i}] is {size} bytes long; at most {MAX_ARG_BYTES} bytes (64 KiB) "
                "per argument are allowed, so pass long data in a file"
            )
        total += size + 1
    if total > MAX_ARGV_BYTES:
        raise SpecError(
            f"{option} is {total} bytes in all; at most {MAX_ARGV_BYTES} bytes (256 KiB) "
            "are allowed, so pass long data in a file"
        )
    if not argv[0].strip():
        raise SpecError("the command is empty; give the program to run as the first argument")
    return list(argv)


RESERVED_ENV_NAMES: Final = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "NNODES",
        "NODE_RANK",
        "NPROC_PER_NODE",
        "RANK",
        "LOCAL_RANK",
    }
)
"""Variables the scheduler sets in every job (or every distributed one)."""
RESERVED_ENV_PREFIXES: Final = ("MGPU_", "PET_", "SLURM_")
RENDEZVOUS_ENV_NAMES: Final = frozenset(
    {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NNODES", "NODE_RANK", "NPROC_PER_NODE"}
    | {"RANK", "LOCAL_RANK"}
)
"""torchrun's rendezvous (with `PET_*`): a Slurm job's own to set, as in Slurm."""
_ENV_NAME_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|BASH_FUNC_[A-Za-z_][A-Za-z0-9_.:+-]*%%")


def is_env_name(name: str) -> bool:
    """A POSIX variable name, or bash's name for an exported function (``BASH_FUNC_f%%``)."""
    return _ENV_NAME_RE.fullmatch(name) is not None


def is_rendezvous_env_name(name: str) -> bool:
    """torchrun's variables (`MASTER_ADDR`, `PET_NNODES` ...)."""
    return name in RENDEZVOUS_ENV_NAMES or name.startswith("PET_")


def is_reserved_env_name(name: str, slurm: bool = False) -> bool:
    """Set by the scheduler: a value the user gives for it is not passed to the job.  A
    Slurm job's (`slurm`) rendezvous variables are the user's: Slurm passes them on, and
    mgpu sets them only where the job has none and asked (`--distributed`)."""
    if slurm and is_rendezvous_env_name(name):
        return False
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)


def validate_env(env: Mapping[str, str], option: str = "--env") -> dict[str, str]:
    """A job's environment: at most 4096 variables with POSIX names, values of UTF-8
    without NUL, each ``NAME=value`` at most 64 KiB and 256 KiB in all."""
    if len(env) > MAX_ENV_VARS:
        raise SpecError(f"{option} has {len(env)} variables; at most {MAX_ENV_VARS} are allowed")
    if _plain_env(env):
        return dict(env)
    total = 0
    for name, value in env.items():
        if not is_env_name(name):  # a valid name is ASCII without NUL: checked only here
            why = text_problem(name) or (
                "is not a variable name; use letters, digits and '_', not starting with a digit"
            )
            raise SpecError(f"{option} name {_q(name)} {why}")
        problem = text_problem(value)
        if problem is not None:
            raise SpecError(f"{option}[{_short(name)}] {problem}")
        size = len(name) + 1 + (len(value) if value.isascii() else len(value.encode("utf-8")))
        if size > MAX_ENV_ENTRY_BYTES:
            raise SpecError(
                f"{option}[{_short(name)}] is {size} bytes long; at most {MAX_ENV_ENTRY_BYTES} "
                "bytes (64 KiB) per variable are allowed"
            )
        total += size + 1
    if total > MAX_ENV_BYTES:
        raise SpecError(
            f"{option} is {total} bytes in all; at most {MAX_ENV_BYTES} bytes (256 KiB) are allowed"
        )
    return dict(env)


_ENV_NAMES_RE: Final = re.compile(rf"(?:(?:{_ENV_NAME_RE.pattern})\n)*")


def _plain_env(env: Mapping[str, str]) -> bool:
    """The common case decided in C, a few microseconds for a whole environment: valid
    names, ASCII values without NUL, every entry and the total well inside the limits.
    False means "look at each variable" (which names the problem, if there is one)."""
    if not env:
        return True
    values = "".join(env.values())
    if not values.isascii() or "\x00" in values:
        return False
    names = "\n".join(env) + "\n"
    if names.count("\n") != len(env) or _ENV_NAMES_RE.fullmatch(names) is None:
        return False  # (a name holding a newline must not pass for two names)
    longest = max(map(len, env)) + 1 + max(map(len, env.values()))
    total = sum(map(len, env)) + len(values) + 2 * len(env)
    return longest <= MAX_ENV_ENTRY_BYTES and total <= MAX_ENV_BYTES


def validate_cwd(text: str) -> str:
    """A working directory: an absolute path of UTF-8 without NUL, at most 4095 bytes."""
    validate_text(text, "--cwd")
    if not text.startswith("/"):
        raise SpecError(f"--cwd {_q(text)} is not an absolute path")
    size = len(text.encode("utf-8"))
    if size > MAX_PATH_BYTES:
        raise SpecError(f"--cwd is {size} bytes long; at most {MAX_PATH_BYTES} are allowed")
    return text


_IMAGE_RE: Final = re.compile(r"[A-Za-z0-9_./:@+=~-]{1,512}")
"""Image names and .sif paths: no whitespace, no shell or option syntax."""


def validate_image(text: str) -> str:
    """A container image name or ``.sif`` path, not looking like an option."""
    validate_text(text, "--image")
    if _IMAGE_RE.fullmatch(text) is None or text.startswith("-"):
        raise SpecError(f"--image {_q(text)} is not a valid image name or .sif path")
    return text
