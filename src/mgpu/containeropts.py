"""A container's options beyond its image: what NVIDIA's pyxis gives `srun` and `sbatch`
(`--container-mounts`, `--container-workdir`, ...), as the master takes them and the agent
turns them into the runtime's command line (mgpu.agent.containers).

A job or step with an image and no options runs as `mgpu submit --image` always has (the
image's entrypoint, writable, the submit directory mounted and the working directory).
With options (mgpu.slurm.pyxis writes them) it runs as pyxis runs one: no entrypoint unless
asked, the mounts named, the working directory named.  Paths are checked here: absolute,
normalised, without `:` or `,` (the runtimes read mount options after a `:`, and a
podman `U` option would chown the source) and short; the agent pins each source as the
job's user reaches it (mgpu.agent.usermounts) before a root runtime sees it.
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Final

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from mgpu.spec import SpecError, _q, validate_text

__all__ = ["GPU_VARIABLES", "MAX_MOUNTS", "ContainerOptions", "Mount", "container_path"]

MAX_MOUNTS: Final = 64
MAX_PATH_BYTES: Final = 4095
GPU_VARIABLES: Final = frozenset({"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"})
"""Never carried from the host by `--container-env`: the container sees its granted GPUs."""
_ENV_NAME_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def container_path(text: str, what: str = "a container path") -> str:
    """An absolute path, normalised, that a runtime's mount option cannot misread."""
    validate_text(text, what)
    if not text.startswith("/"):
        raise SpecError(f"{what} {_q(text)} is not an absolute path")
    if any(c in text for c in ":,\n"):
        raise SpecError(f"{what} {_q(text)} has a ':', ',' or newline, which a mount cannot hold")
    if len(text.encode()) > MAX_PATH_BYTES:
        raise SpecError(f"{what} is over {MAX_PATH_BYTES} bytes")
    return os.path.normpath(text).replace("//", "/")


def _source(text: str) -> str:
    return container_path(text, "--container-mounts source")


def _target(text: str) -> str:
    path = container_path(text, "--container-mounts target")
    if path == "/":
        raise SpecError("--container-mounts cannot mount over the container's /")
    return path


def _workdir(text: str) -> str:
    return container_path(text, "--container-workdir")


def _env_names(names: list[str]) -> list[str]:
    for name in names:
        if _ENV_NAME_RE.fullmatch(name) is None:
            raise SpecError(f"--container-env {_q(name)} is not a variable name")
        if name in GPU_VARIABLES:
            raise SpecError(
                f"--container-env cannot carry {name}: the container sees the GPUs the job "
                "was granted"
            )
    return list(dict.fromkeys(names))


class Mount(BaseModel):
    """One `--container-mounts` entry: a host path (or a fresh tmpfs) at `target`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Annotated[str, AfterValidator(_source)] | None = None
    """The host path; None for a tmpfs."""
    target: Annotated[str, AfterValidator(_target)]
    readonly: bool = False
    tmpfs: bool = False


class ContainerOptions(BaseModel):
    """pyxis's container options that mgpu honours (the rest are refused by the client)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mounts: list[Mount] = Field(default_factory=list, max_length=MAX_MOUNTS)
    workdir: Annotated[str, AfterValidator(_workdir)] | None = None
    """The working directory inside (None: the submit directory, mounted at its path)."""
    entrypoint: bool = False
    """Run the image's entrypoint before the command (`--container-entrypoint`)."""
    readonly: bool = False
    """`--container-readonly`: the image's filesystem read-only."""
    writable: bool = False
    """`--container-writable` (apptainer: a writable tmpfs over its read-only image)."""
    mount_home: bool = False
    """`--container-mount-home`: the job user's home at its path."""
    env: Annotated[list[str], Field(max_length=1024), AfterValidator(_env_names)] = Field(
        default_factory=list
    )
    """`--container-env`: variables passed from the host even where mgpu would not (PATH,
    HOME, LD_LIBRARY_PATH ...)."""

    def model_post_init(self, _context: object) -> None:
        if self.readonly and self.writable:
            raise SpecError("both --container-writable and --container-readonly were given")
        for m in self.mounts:
            if m.tmpfs != (m.source is None):
                raise SpecError("a --container-mounts entry is a host path or tmpfs, not both")
