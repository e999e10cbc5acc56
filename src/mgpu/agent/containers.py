"""Container runtimes on a node: probing them, and the command lines that run a job inside.

A job submitted with `--image IMAGE` runs as `<runtime> run ... IMAGE ARGV` under the
usual shim, so output, exit codes, time limits and cancellation work as for any job.
The runtime is the node's own (podman, docker or apptainer), found when the agent
starts and reported to the master as the node features `container` and its name.

What every command line does:

* GPUs: only the granted ones are visible, by the flags mgpu.agent.grants makes of the
  run's grant (podman's CDI names, docker's `--gpus`, apptainer's `--nv` narrowed by
  `CUDA_VISIBLE_DEVICES`).
* The submit directory is mounted at the same path and is the working directory.  A root
  runtime gets it as a mount point the agent bound from a descriptor its user opened
  (mgpu.agent.bindmount), never by its name, which the user may change.  A directory
  with `:` in its name is refused: the runtimes' mount options follow a `:`.
* The job keeps its user's uid/gid: `--user uid:gid` for docker and rootful podman (the
  agent runs the runtime as root), `--userns=keep-id` for rootless podman (the agent and
  its jobs run as one user), and apptainer runs as the user anyway.  A root runtime's own
  process starts in `/`, and nothing the user names outside the container (a batch job's
  -o/-e files, a job script) is opened or run for it (mgpu.agent.launchsteps.check_owner).
* The host network and IPC namespace (NCCL and torchrun rendezvous need them).
* No new privileges (`--security-opt=no-new-privileges`): a setuid or file-capability
  binary in the image (sudo, su, ping) cannot raise the job above its user inside the
  container.  apptainer sets `PR_SET_NO_NEW_PRIVS` itself.
* podman and docker run as the agent (root) with the agent's own environment
  (mgpu.agent.privileged), never the job's.  The job's variables go into the container
  through a 0600 `--env-file` in the agent's private spool (not `-e NAME=VALUE`: values
  would show in `ps`), except variables that describe the host (PATH, HOME,
  LD_LIBRARY_PATH, ...).  `MGPU_RUN_TAG` goes in too, by name from the runtime's
  environment: the agent finds and kills the container's processes by it, as it does for
  any job's escaped processes.  apptainer runs as the job's user with its environment.

Everything here but `probe` and `image_present` is pure and unit-tested line by line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from mgpu.agent import grants, privileged
from mgpu.agent.privileged import RUNTIME_ENV
from mgpu.containeropts import GPU_VARIABLES, ContainerOptions
from mgpu.protocol import Grant

RUNTIMES = ("podman", "docker", "apptainer")
"""In the order `auto` tries them."""

FEATURE = "container"
"""The node feature of every node with a runtime; `--image` jobs require it."""

_HOST_ONLY = frozenset(
    {
        "PATH",
        "HOME",
        "PWD",
        "OLDPWD",
        "HOSTNAME",
        "SHELL",
        "SHLVL",
        "USER",
        "LOGNAME",
        "MAIL",
        "TMPDIR",
        "TERM",
        "LD_LIBRARY_PATH",
        "LD_PRELOAD",
        "PYTHONHOME",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "_",
    }
)
_HOST_ONLY_PREFIXES = ("XDG_", "CONTAINERS_", "DOCKER_", "APPTAINER_", "SINGULARITY_", "CONDA_")


@dataclass(frozen=True, slots=True)
class Runtime:
    name: str
    """podman, docker or apptainer."""
    exe: str
    """Path of its executable."""
    version: str = ""
    rootless: bool = False
    """podman run by a non-root agent: jobs keep their uid with --userns=keep-id."""


# ---- probing (at agent start) ---------------------------------------------------------


def _version_argv(name: str, exe: str) -> list[str]:
    if name == "docker":
        # `docker --version` answers without a daemon; this needs the daemon up.
        return [exe, "version", "--format", "{{.Server.Version}}"]
    return [exe, "--version"]


def probe(choice: str = "auto", timeout: float = 10.0) -> Runtime | None:
    """The runtime to use: `choice` (a name or `none`), or the first that works (`auto`).

    Found with `shutil.which` and checked with a cheap version call, so a client-only
    docker (no daemon) or a broken install is not advertised."""
    if choice == "none":
        return None
    names = RUNTIMES if choice == "auto" else (choice,)
    for name in names:
        exe = shutil.which(name)
        if exe is None:
            continue
        try:
            res = privileged.run(_version_argv(name, exe), timeout)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if res.returncode != 0:
            continue
        version = (res.stdout.strip().splitlines() or [""])[0]
        return Runtime(name, exe, version, rootless=name == "podman" and os.geteuid() != 0)
    return None


def features(runtime: Runtime | None) -> list[str]:
    """The node features a runtime gives (`container` and its name)."""
    return [] if runtime is None else [FEATURE, runtime.name]


# ---- images ---------------------------------------------------------------------------


def is_image_file(image: str) -> bool:
    """A path (a SIF or squashfs file), not a name a registry or the runtime's store has."""
    return image.startswith("/")


def runs_files(runtime: Runtime) -> bool:
    """Can the runtime run an image file (SIF, squashfs)?  apptainer can; podman and
    docker run the images in their store."""
    return runtime.name == "apptainer"


def is_image_uri(image: str) -> bool:
    """apptainer `docker://...`, `library://...`: pulled on use, cannot be checked cheaply."""
    return "://" in image


def image_check_argv(runtime: Runtime, image: str) -> list[str] | None:
    """The command whose success says the image is present on this node (None: a file)."""
    if runtime.name == "podman":
        return [runtime.exe, "image", "exists", image]
    if runtime.name == "docker":
        return [runtime.exe, "image", "inspect", "--format", "{{.Id}}", image]
    return None


class ImageCheckError(RuntimeError):
    """The runtime could not say (it hung or failed): the node's problem, not the image's."""


async def image_present(runtime: Runtime, image: str, timeout: float = 60.0) -> bool:
    """Is `image` on this node?  Raises ImageCheckError when the runtime cannot answer."""
    argv = image_check_argv(runtime, image)
    if argv is None:  # apptainer: a .sif file (or a URI it pulls itself)
        return is_image_uri(image) or os.path.isfile(image)
    try:
        proc = await privileged.start(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except OSError as e:
        raise ImageCheckError(f"cannot run {runtime.name}: {e.strerror}") from None
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise ImageCheckError(f"{runtime.name} did not answer within {timeout:g} s") from None
    if proc.returncode == 0:
        return True
    if runtime.name == "podman" and proc.returncode == 1:
        return False  # `podman image exists`: 1 = no such image, other codes = errors
    text = err.decode(errors="replace").lower()
    if runtime.name == "docker" and ("no such image" in text or "no such object" in text):
        return False
    first = (err.decode(errors="replace").strip().splitlines() or ["no message"])[0]
    raise ImageCheckError(f"{runtime.name} failed to look up the image: {first}")


# ---- command lines --------------------------------------------------------------------


def container_name(job_id: str, epoch: int) -> str:
    """A name unique per run, valid for podman and docker: `mgpu-JOB-EPOCH-RANDOM`.  Job
    ids are small numbers per cluster, so another cluster on this machine (or a container
    a crashed run left) may hold `mgpu-1-1`: the random part keeps them apart."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", job_id)
    return f"mgpu-{safe}-{epoch}-{secrets.token_hex(4)}"


def passed_env(env: Mapping[str, str], also: Collection[str] = ()) -> list[str]:
    """Names of the job's variables to pass into the container (sorted); `also`: names
    passed even where they describe the host (pyxis's `--container-env`)."""
    return sorted(
        k
        for k in env
        if (k in also or (k not in _HOST_ONLY and not k.startswith(_HOST_ONLY_PREFIXES)))
        and k not in GPU_VARIABLES
        and privileged.ENV_NAME.match(k) is not None
    )


def build_argv(
    runtime: Runtime,
    image: str,
    argv: Sequence[str],
    *,
    grant: Grant,
    cwd: str | None,
    uid_gid: tuple[int, int] | None,
    env_file: str | None,
    name: str,
    source: str | None = None,
    options: ContainerOptions | None = None,
    binds: Sequence[tuple[str, str, bool]] = (),
) -> list[str]:
    """The command line that runs `argv` in `image` with the GPUs of `grant`, directory
    and user.

    The job's variables come from `env_file` (podman, docker); CUDA_VISIBLE_DEVICES is set
    here, as it must be seen inside.  `source`: what podman or docker mounts at `cwd` (the
    pinned mount point of mgpu.agent.bindmount; default `cwd` itself).  `options`: pyxis's
    (mgpu.containeropts), `binds` the host paths they mount as the runtime gets them
    (mgpu.agent.usermounts: (source, target, read-only))."""
    gpus = grants.container_gpus(runtime.name, grant)  # ValueError: an unknown runtime
    workdir = (options.workdir if options is not None else None) or cwd
    if runtime.name in ("podman", "docker"):
        out = [runtime.exe, "run", "--rm", "--name", name, "--network=host", "--ipc=host"]
        # A setuid binary in the image must not make the job's user root inside it.
        out.append("--security-opt=no-new-privileges")
        if runtime.name == "podman":
            out.append("--security-opt=label=disable")  # SELinux hosts: the bind mount works
            if runtime.rootless:
                out.append("--userns=keep-id")
            elif uid_gid is not None:
                out += ["--user", f"{uid_gid[0]}:{uid_gid[1]}"]
        elif uid_gid is not None:
            out += ["--user", f"{uid_gid[0]}:{uid_gid[1]}"]
        out += gpus.flags
        if cwd:
            out += ["-v", f"{source or cwd}:{cwd}"]
        out += _box_flags(options, binds, "-v")
        if workdir:
            out += ["-w", workdir]
        if env_file is not None:
            out += ["--env-file", env_file]
        out += gpus.env
        return [*out, image, *argv]
    # apptainer: `run` runs the image's runscript (its entrypoint) with the arguments.
    verb = "run" if options is not None and options.entrypoint else "exec"
    out = [runtime.exe, verb, *gpus.flags]
    if cwd:
        out += ["--bind", cwd]
    out += _box_flags(options, binds, "--bind")
    if options is not None and options.writable:
        out.append("--writable-tmpfs")  # its image is read-only; this lets the job write
    if options is not None and not options.mount_home:
        out.append("--no-home")  # pyxis's default (its home comes as a bind, if asked)
    if workdir:
        out += ["--pwd", workdir]
    # apptainer passes the environment through; this sets the GPUs' variable over it.
    out += gpus.env
    return [*out, image, *argv]


def _box_flags(
    options: ContainerOptions | None, binds: Sequence[tuple[str, str, bool]], flag: str
) -> list[str]:
    """The mounts and filesystem flags of pyxis's options (`flag`: the runtime's bind)."""
    out: list[str] = []
    for source, target, readonly in binds:
        out += [flag, f"{source}:{target}" + (":ro" if readonly else "")]
    if options is None:
        return out
    for mount in options.mounts:
        if mount.tmpfs:  # apptainer's scratch directory is its tmpfs
            out += ["--scratch" if flag == "--bind" else "--tmpfs", mount.target]
    if flag == "-v":
        if options.readonly:
            out.append("--read-only")
        if not options.entrypoint:
            out.append("--entrypoint=")  # pyxis runs the command itself, not the image's
    return out


def cleanup_argv(runtime: Runtime, name: str) -> list[str] | None:
    """Removes what a killed run may leave behind (`--rm` needs the runtime to live on)."""
    if runtime.name in ("podman", "docker"):
        return [runtime.exe, "rm", "-f", name]
    return None


def uses_env_file(runtime: Runtime) -> bool:
    """podman and docker take the job's variables from a file (see `build_argv`)."""
    return runtime.name in ("podman", "docker")


def runs_as_agent(runtime: Runtime) -> bool:
    """True when the runtime itself must run as the agent's user (not switched to the job's
    user): docker talks to its daemon, rootful podman needs root; the uid is kept by
    `--user`.  apptainer and rootless podman run as the job's user like any job."""
    return runtime.name == "docker" or (runtime.name == "podman" and not runtime.rootless)


__all__ = [
    "FEATURE",
    "RUNTIMES",
    "RUNTIME_ENV",
    "ImageCheckError",
    "Runtime",
    "build_argv",
    "cleanup_argv",
    "container_name",
    "features",
    "image_check_argv",
    "image_present",
    "is_image_file",
    "is_image_uri",
    "passed_env",
    "probe",
    "runs_as_agent",
    "runs_files",
    "uses_env_file",
]
